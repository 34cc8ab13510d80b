"""``tillerman replay --jobs N``: thread families on worker processes, one result for any N."""

import contextlib
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from bench.sessions import rollout_name, write_rollout
from tests.controller.test_replay import STALL, replay, replay_json
from tillerman.controller.cli.main import main
from tillerman.controller.replay import parallel as parallel_replay
from tillerman.controller.replay.parallel import ReplaySettings, replay_files
from tillerman.ledger.events import Envelope
from tillerman.rules.files import default_ruleset

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
STALL_FILE = next(STALL.glob("rollout-*.jsonl"))
GRANTS = STALL / "grants.toml"
LEGACY = SESSIONS / "claude-transcript" / "legacy-1.0-sidechain.jsonl"
VIEWER = SESSIONS / "public" / "claude-transcript" / "claude-code-viewer" / "5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> Path:
    """Generated rollouts whose repeated failures propose steers (decisions to digest),
    beside the recorded fixtures."""
    folder = tmp_path_factory.mktemp("sessions")
    for seed in range(1, 5):
        write_rollout(str(folder / rollout_name(seed)), 400, seed)
    return folder


def test_a_file_replays_beside_unrelated_files_as_it_does_alone():
    """Each thread family runs on its own clock: the stall file, recorded a year after the
    transcript, no longer fires the transcript's rule timers (it reported two stalls
    "for 407 days" at the stall file's time, and only when named after the transcript)."""
    alone = [replay_json("--config", GRANTS, path) for path in (VIEWER, STALL_FILE)]
    for both in (replay_json("--config", GRANTS, VIEWER, STALL_FILE), replay_json("--config", GRANTS, STALL_FILE, VIEWER)):
        for key in ("events", "decisions", "reports"):
            assert both[key] == sum(a[key] for a in alone), key
        assert both["decisions_digest"] == alone[1]["decisions_digest"]  # the transcript decides nothing
    assert both["files"] == [alone[1]["files"][0], alone[0]["files"][0]]


@pytest.mark.parametrize("jobs", ["2", "3"])
def test_the_summary_is_the_same_for_any_number_of_jobs(sessions, jobs):
    args = ("--config", GRANTS, sessions, SESSIONS)
    one = replay_json("--jobs", "1", *args)
    assert one["decisions"] > 10 and one["intents"]
    assert replay_json("--jobs", jobs, *args) == one


@pytest.mark.parametrize("load_bytes", [0, 10**12], ids=["loaded", "appended"])
def test_the_ledger_is_the_same_for_any_number_of_jobs_and_its_decisions_are_the_digest(sessions, tmp_path,
                                                                                         monkeypatch, load_bytes):
    """With two jobs the parent writes the workers' rows through the new ledger's load
    (``load_bytes`` 0: any input is enough) or appends them itself: the same rows as one job."""
    from tillerman.controller.replay import replayer as replay_module

    monkeypatch.setattr(replay_module, "LOAD_BYTES", load_bytes)
    exports, summaries = [], []
    for jobs in ("1", "2"):
        ledger = tmp_path / f"jobs-{jobs}.sqlite3"
        summaries.append(replay_json("--jobs", jobs, "--ledger", ledger, "--config", GRANTS, sessions, STALL))
        result = CliRunner().invoke(main, ["ledger", "export", "--ledger", str(ledger)])
        assert result.exit_code == 0, result.output
        exports.append(result.output)
    assert exports[0] == exports[1]
    assert {k: v for k, v in summaries[0].items() if k != "ledger"} == \
           {k: v for k, v in summaries[1].items() if k != "ledger"}
    digest = hashlib.sha256()
    for line in exports[0].splitlines():
        envelope = json.loads(line)["envelope"]
        event = envelope["event"]
        if event["kind"] == "decision":
            record = [event["intent_id"], event["action"], event["reason"], event.get("rule_id"), envelope["at"]]
            digest.update(msgspec.json.encode(record) + b"\n")
    assert summaries[0]["decisions_digest"] == "sha256:" + digest.hexdigest()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_bad_file_among_many_fails_as_it_does_alone(tmp_path, jobs):
    unknown = tmp_path / "notes.jsonl"
    unknown.write_text("hello\n")
    assert replay("--jobs", jobs, LEGACY, unknown, STALL_FILE) == replay(unknown)
    ledger = tmp_path / "damaged.sqlite3"
    replay_json("--ledger", ledger, STALL_FILE)
    with contextlib.closing(sqlite3.connect(ledger)) as db, db:  # committed, then closed
        db.execute("UPDATE events SET at = at + 1 WHERE seq = 2")
    code, out = replay("--jobs", jobs, STALL_FILE, ledger, LEGACY)
    assert code == 1 and "the ledger is damaged" in out


def test_progress_counts_every_byte_of_every_file_across_workers(sessions):
    calls = []
    paths = sorted(str(p) for p in sessions.iterdir())
    replay_files(paths, ReplaySettings(ruleset=default_ruleset()), jobs=2, progress=lambda *call: calls.append(call))
    total = sum(os.path.getsize(p) for p in paths)
    done = [d for _, d, _ in calls]
    assert done == sorted(done) and done[-1] == total and {t for _, _, t in calls} == {total}


def test_check_takes_no_jobs(tmp_path):
    ledger = tmp_path / "l.sqlite3"
    replay_json("--ledger", ledger, STALL_FILE)
    code, out = replay("--check", "--jobs", "2", ledger)
    assert code == 2 and "drop --jobs" in out


def _group_members(pgid: int) -> set[int]:
    members = set()
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            members.add(int(entry))
    return members


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_ctrl_c_stops_the_workers(tmp_path):
    for seed in range(1, 5):
        write_rollout(str(tmp_path / rollout_name(seed)), 30_000, seed)
    # Ctrl-C as a terminal's shell leaves it, whatever this test process was given (a
    # process that ignores SIGINT hands that to its children, and the replay ran on).
    proc = subprocess.Popen([sys.executable, "-m", "tillerman.controller", "replay", "--jobs", "2", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(_group_members(proc.pid)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the parent and two workers (forked from it: no fork server)
    assert proc.poll() is None, "the replay ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: to the whole foreground group
    assert proc.wait(timeout=30) != 0
    while _group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _group_members(proc.pid)
    assert b"Traceback" not in proc.stderr.read()


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="starts no fork server")
def test_a_ctrl_c_while_the_fork_server_starts_is_not_lost(monkeypatch):
    """Ctrl-C in the second the fork server takes to start (its imports): the replay
    stops once the server stands; it was ignored and the replay ran to its end."""
    import multiprocessing.forkserver

    def starting() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # the person presses Ctrl-C now

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", starting)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C finds it
    try:
        with pytest.raises(KeyboardInterrupt):
            parallel_replay._context(ledger=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_workers_are_forked_from_the_parent_unless_a_ledger_is_open(monkeypatch):
    """A forked worker starts at once (the parent has imported what it runs); with a
    ledger open, or another thread running, a fork server starts them as before. The
    count of threads is pinned: earlier tests in this process leave idle worker threads."""
    threads = {"count": 1}
    monkeypatch.setattr(parallel_replay.threading, "active_count", lambda: threads["count"])
    assert parallel_replay._context(ledger=False).get_start_method() == "fork"
    assert parallel_replay._context(ledger=True).get_start_method() in ("forkserver", "spawn")
    threads["count"] = 2  # another thread runs: a fork would copy its locks mid-use
    assert parallel_replay._context(ledger=False).get_start_method() in ("forkserver", "spawn")


def test_one_large_file_is_read_on_a_second_core_with_jobs_2_and_replays_the_same(tmp_path, monkeypatch):
    """One group leaves the pool out; with a core to spare its files are read and parsed
    in a child process (``ForkedFileReader``), and nothing of the result changes. With
    ``--jobs 1``, and for a file under ``PARSE_AHEAD_BYTES``, everything stays here."""
    from tillerman.controller.replay import replayer as replay_module
    from tillerman.monitor.file_reader import ForkedFileReader

    big = tmp_path / rollout_name(9)
    write_rollout(str(big), 6000, seed=9)
    assert big.stat().st_size >= replay_module.PARSE_AHEAD_BYTES
    forked: list[str] = []

    class Spy(ForkedFileReader):
        def chunks(self):
            forked.append(self.path)
            return super().chunks()

    monkeypatch.setattr(replay_module, "ForkedFileReader", Spy)
    # Other tests of this process may leave a thread running, which forbids the fork
    # (test_a_file_is_read_here_while_another_thread_runs): here, none is taken to run.
    monkeypatch.setattr(replay_module, "_may_fork", lambda: True)
    settings = ReplaySettings(ruleset=default_ruleset())
    one = replay_files([str(big)], settings, jobs=1)
    assert forked == []
    two = replay_files([str(big)], settings, jobs=2)
    assert forked == [str(big)]
    assert msgspec.to_builtins(two) == msgspec.to_builtins(one)
    assert one.decisions > 0
    replay_files([str(STALL_FILE)], settings, jobs=2)
    assert forked == [str(big)]  # a small file is read here


def test_into_a_sqlite_ledger_the_log_is_checkpointed_beside_each_forked_reader(tmp_path, monkeypatch):
    """While a forked child parses a file into a SQLite ledger, a thread of the parent
    copies the log into the database; it is gone when the file ends, so the next file's
    reader is forked too (a thread alive at a fork is refused, as ``_may_fork`` refuses
    it), and the ledger holds what the replay decided."""
    import shutil
    import threading

    from tillerman.controller.replay import replayer as replay_module
    from tillerman.ledger.sqlite import SQLiteRecorder
    from tillerman.monitor.file_reader import ForkedFileReader

    def checkpointing() -> bool:
        return any(t.name == "tillerman-checkpoint" for t in threading.enumerate())

    first = tmp_path / "a" / rollout_name(9)
    first.parent.mkdir()
    write_rollout(str(first), 6000, seed=9)
    second = tmp_path / "b" / first.name  # the same session again: one thread group
    second.parent.mkdir()
    shutil.copy(first, second)
    seen: list[tuple[str, bool]] = []

    class Spy(ForkedFileReader):
        def chunks(self):
            during = []
            for chunk in super().chunks():
                yield chunk
                during.append(checkpointing())
            seen.append((self.path, any(during)))

    monkeypatch.setattr(replay_module, "ForkedFileReader", Spy)
    monkeypatch.setattr(replay_module, "_may_fork", lambda: not checkpointing())
    # appended here, as into a ledger that has rows (the load's writer checkpoints its own commits)
    monkeypatch.setattr(replay_module, "LOAD_BYTES", 1 << 62)
    settings = ReplaySettings(ruleset=default_ruleset())
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as ledger:
        summary = replay_files([str(first), str(second)], settings, jobs=2, ledger=ledger)
        assert not checkpointing()
        assert ledger.verify().ok
    assert seen == [(str(first), True), (str(second), True)]
    in_memory = replay_files([str(first), str(second)], settings, jobs=1)
    assert (summary.decisions, summary.decisions_digest) == (in_memory.decisions, in_memory.decisions_digest) \
        and summary.decisions > 0


def test_a_file_is_read_here_while_another_thread_runs():
    """A thread holding a lock at a fork would leave it held in the child: no fork then."""
    import threading

    from tillerman.controller.replay import replayer as replay_module

    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert not replay_module._may_fork()
    finally:
        release.set()
        thread.join()


def test_a_reader_that_dies_fails_the_replay_with_a_clear_error(tmp_path, monkeypatch):
    """Exit 2, the file named, how the child ended and what to do: nothing half-reported."""
    from tillerman.controller.replay import replayer as replay_module
    from tillerman.monitor.file_reader import ForkedFileReader

    class Dying(ForkedFileReader):
        def _send_all(self, write_fd: int) -> int:
            return 3

    monkeypatch.setattr(replay_module, "ForkedFileReader", Dying)
    monkeypatch.setattr(replay_module, "_may_fork", lambda: True)
    monkeypatch.setattr(replay_module, "PARSE_AHEAD_BYTES", 0)
    result = CliRunner().invoke(main, ["replay", "--jobs", "2", str(STALL_FILE)])
    assert result.exit_code == 2, result.output
    assert str(STALL_FILE) in result.output and "exit status 3" in result.output and "--jobs 1" in result.output


@pytest.mark.parametrize(("jobs", "rows_first", "many", "twice", "loaded"), [
    (2, False, False, False, True), (1, False, False, False, False), (2, True, False, False, False),
    (2, False, True, False, True), (2, False, True, True, False), (2, True, True, False, False),
])
def test_a_new_ledger_is_loaded_by_a_writer_process_only_with_a_core_to_spare(tmp_path, monkeypatch, sessions, jobs,
                                                                                rows_first, many, twice, loaded):
    """``--jobs 2`` into a new ledger writes through its load: one group's replay, or the
    parent for the workers of ``many`` groups. ``--jobs 1`` replays in this process, a
    ledger that has rows is appended to by its recorder, and a file named ``twice``
    repeats its ids, which only the recorder's lookup drops: all three without one."""
    from tillerman.controller.replay import replayer as replay_module
    from tillerman.ledger import sqlite
    from tillerman.ledger.load import LedgerLoad
    from tillerman.ledger.sqlite import SQLiteRecorder

    monkeypatch.setattr(replay_module, "LOAD_BYTES", 0)
    loads = []
    monkeypatch.setattr(sqlite, "LedgerLoad", lambda path: loads.append(path) or LedgerLoad(path))
    settings = ReplaySettings(ruleset=default_ruleset())
    paths = [str(STALL_FILE)]
    if many:
        paths += sorted(str(p) for p in sessions.iterdir())
    if twice:
        paths.append(paths[-1])
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as ledger:
        if rows_first:
            replay_files([str(STALL_FILE)], settings, jobs=1, ledger=ledger)
        replay_files(paths, settings, jobs=jobs, ledger=ledger)
        assert ledger.verify().ok and ledger.max_seq() > 0
    assert bool(loads) == loaded


def _group_result(*envelopes) -> parallel_replay.GroupResult:
    summary = parallel_replay.ReplaySummary(files=[], events=0, decisions=0, decisions_digest="", reports=0,
                                            intents={}, overdue=[], ruleset_digest="")
    return parallel_replay.GroupResult(summary, b"", [msgspec.msgpack.encode(list(envelopes))])


def test_the_parent_loads_observations_without_keeping_their_ids_and_drops_a_record_met_twice(tmp_path,
                                                                                               monkeypatch):
    """Through the load, a group's observations go by ``append_new`` and what the workers
    recorded by ``append``: a record two groups both made is stored once, as the recorder
    itself stores it, and the load keeps the ids of those records only."""
    from tillerman.ledger import events as ev
    from tillerman.ledger import sqlite
    from tillerman.ledger.load import LedgerLoad
    from tillerman.ledger.sqlite import SQLiteRecorder
    from tillerman.monitor.tailer import file_source

    loads = []
    monkeypatch.setattr(sqlite, "LedgerLoad", lambda path: loads.append(LedgerLoad(path)) or loads[-1])

    def observed(name):
        return Envelope(event_id=f"{name}:0", event=ev.TurnStarted(thread_id=name, turn_id="t"),
                        source=file_source(f"/sessions/{name}.jsonl"), at=1.0, observed_at=1.0)

    report = Envelope(event_id="report:shared", event=ev.Report(rule_id="r", rule_version=1, finding="f"),
                      source="tillerman", at=2.0, observed_at=2.0)
    groups = [_group_result(observed("a"), report), _group_result(observed("b"), report, observed("c"))]
    rows = []
    for load in (False, True):
        path = tmp_path / f"load-{load}.sqlite3"
        with SQLiteRecorder(path) as ledger:
            with parallel_replay._appender(ledger, load) as append:
                for group in groups:
                    append(group)
            assert ledger.verify().ok
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows.append(db.execute("SELECT seq, event_id, prev_hash, hash FROM events ORDER BY seq").fetchall())
    assert [row[1] for row in rows[0]] == ["a:0", "report:shared", "b:0", "c:0"]
    assert rows[1] == rows[0]
    assert len(loads) == 1 and loads[0].ids_kept() == 1  # the report's: no observation's
