"""Every command's options driven with hostile values — huge, negative, NaN and
infinite numbers, empty and blank strings, control characters, out-of-range times,
URLs, FIFOs and devices: the exit code is 0, 1 or 2, nothing raises past the command
line (no traceback), and an exit 2 wrote nothing (the ledger's last seq and the files
around it are unchanged). ``FUZZ_EXAMPLES=N`` draws N command lines per command (60)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder

NUMBERS = ["0", "-1", "-0", "1e400", "-1e400", "nan", "inf", "-inf", "9" * 400, str(2**64), "0x10", "1_000", "١٢"]
DURATIONS = ["0s", "-5m", "infs", "nans", "1e400s", "9" * 400 + "s", "99999999d", "367d", "0.0000001ms", "5 m", "1h30m"]
TIMES = ["", " ", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "10000-01-01",
         "2026-02-30T00:00:00Z", "2026-11-30T12:00:00+25:00", "now", "yesterday"]
TEXTS = ["", " ", "\t", "\n", "a\nb", "\r", "\x00", "x\x00y", "\x1b[2J", "😀", "a" * 5000, "%s%n", "--help", "-"]
URLS = ["postgresql://u@db/x", "sqlite:///x", "http://127.0.0.1:1", "ws://", "ws://10.0.0.1:1", "wss://[::1]:0",
        "ws://127.0.0.1:99999", "unix://", "unix://\x00", "file:///etc/passwd", "://"]
# Paths: relative ones (inside the test's folder) and a character device; a FIFO only where
# the command must refuse it by its type (the ledger, replay's inputs, --watch, --trace, shim).
# Rule and config files are read by their loaders, which bound what they read themselves.
PATHS = ["", " ", "missing/x", "nowhere.sqlite3", "dir", "/dev/null", "a" * 300, "x\x00y", "."]
FILES = ["", "missing.toml", "dir", "/dev/null", "a" * 300]
# Where a command writes a file (tillerman.ledger.paths): the ledger, its companions, a
# symlink to either, a FIFO, a device, a folder, a missing folder — each refused.
OUTPUTS = ["ledger.sqlite3", "ledger.sqlite3.head", "ledger.sqlite3.lock", "ledger.sqlite3-wal", "to-ledger",
           "to-anchor", "fifo", "/dev/null", "dir", "missing/x", "", "x\x00y"]

hostile = st.sampled_from(NUMBERS + DURATIONS + TIMES + TEXTS + URLS + PATHS) | st.text(max_size=30)
durations = st.sampled_from(DURATIONS + NUMBERS) | hostile
times = st.sampled_from(TIMES + NUMBERS) | hostile
ledgers = st.sampled_from(PATHS + URLS + ["ledger.sqlite3", "fifo"])
outputs = st.sampled_from(OUTPUTS) | hostile
files = st.sampled_from(FILES) | hostile

# command -> (fixed arguments, {option: strategy}); flags are drawn as booleans
COMMANDS: dict[str, tuple[list[str], dict[str, st.SearchStrategy]]] = {
    "propose": (["intent", "propose"], {
        "--thread": st.sampled_from(["T1", ""]) | hostile, "--mode": st.sampled_from(["queue", "steer"]) | hostile,
        "--text": st.just("hi") | hostile, "--expected-turn": st.sampled_from(["active", "U1"]) | hostile,
        "--ack-deadline": durations, "--effect-deadline": durations, "--expires": durations,
        "--expect": hostile, "--verify": hostile, "--supersedes": hostile, "--ack-token": hostile,
        "--owner": hostile, "--ledger": ledgers, "--force": st.booleans(), "--resume-queue": st.booleans()}),
    "cancel": (["intent", "cancel"], {"": st.sampled_from(["INTENT"]) | hostile, "--ledger": ledgers}),
    "show": (["intent", "show"], {"": st.sampled_from(["INTENT"]) | hostile, "--ledger": ledgers}),
    "intents": (["intents"], {"--state": st.sampled_from(["proposed"]) | hostile, "--ledger": ledgers}),
    "overdue": (["overdue"], {"--now": times, "--check": st.booleans(), "--ledger": ledgers}),
    "status": (["status"], {"--ledger": ledgers}),
    "verify": (["ledger", "verify"], {"--ledger": ledgers}),
    "export": (["ledger", "export"], {"--after": st.sampled_from(NUMBERS) | hostile, "--ledger": ledgers}),
    "replay": (["replay"], {"": st.sampled_from(["sessions", "fifo", "/dev/null", "ledger.sqlite3"]) | hostile,
                            "--format": st.sampled_from(["auto", "ledger"]) | hostile, "--ledger": ledgers,
                            "--rules": files, "--config": files}),
    "run": (["run"], {"--codex": st.sampled_from(URLS) | hostile, "--no-codex": st.booleans(),
                      "--watch": st.sampled_from(["sessions", "fifo"]) | hostile, "--client-name": hostile,
                      "--allow-remote": st.booleans(), "--ledger": ledgers, "--rules": files, "--config": files,
                      "--trace": outputs, "--on-overdue": hostile,
                      "--codex-bin": files}),
    "shim": (["shim"], {"": st.sampled_from(["missing.sock", "fifo", "/dev/null"]) | hostile}),
    "rules-validate": (["rules", "validate"], {"": files}),
    "rules-show": (["rules", "show"], {"--rules": files, "--config": files, "--now": times}),
    "rules-diff": (["rules", "diff"], {"--against": files, "--rules": files, "--ledger": ledgers,
                                       "": st.sampled_from(["sessions"]) | hostile}),
    "rules-propose": (["rules", "propose"], {"": files, "--evidence": hostile, "--signature": hostile,
                                             "--by": hostile, "--ledger": ledgers}),
    "rules-promote": (["rules", "promote"], {"": st.sampled_from(["quiet"]) | hostile,
                                             "--to": st.sampled_from(["shadow", "active"]) | hostile,
                                             "--by": hostile, "--evaluation": hostile,
                                             "--rollback-trigger": hostile, "--rules": files | outputs,
                                             "--ledger": ledgers}),
    "rules-proposals": (["rules", "proposals"], {"--ledger": ledgers}),
    "report": (["report"], {"--db": outputs, "--force": st.booleans(), "--ledger": ledgers}),
    "timeline": (["timeline"], {"--html": outputs, "--force": st.booleans(), "--ledger": ledgers}),
    "copy": (["ledger", "copy", "ledger.sqlite3"], {"": outputs}),
}


#: The option naming the file a command writes ("": its last argument).
WRITES = {"report": "--db", "timeline": "--html", "run": "--trace", "copy": ""}


def _writes_to_a_hostile_output(name: str, args: list[str]) -> bool:
    option = WRITES.get(name)
    if option is None:
        return False
    if option == "":
        return len(args) > 3 and args[3] in OUTPUTS
    return option in args[:-1] and args[args.index(option) + 1] in OUTPUTS


def command_lines(name: str) -> st.SearchStrategy[list[str]]:
    fixed, options = COMMANDS[name]

    @st.composite
    def draw(draw_) -> list[str]:
        args = list(fixed)
        chosen = draw_(st.lists(st.sampled_from(sorted(options)), unique=True))
        for option in chosen:
            value = draw_(options[option])
            if value is True:
                args.append(option)
            elif value is False:
                continue
            elif option == "":
                args.append(value)
            else:
                args += [option, value]
        return args

    return draw()


@pytest.fixture
def place(tmp_path_factory, monkeypatch):
    """A folder with a ledger (an observation, an intent), a sessions folder, a FIFO
    and a subfolder; commands run inside it and never start a daemon or a shim."""
    root = tmp_path_factory.mktemp("fuzz")
    monkeypatch.chdir(root)
    monkeypatch.setenv("TILLERMAN_LEDGER", str(root / "ledger.sqlite3"))
    with SQLiteRecorder(root / "ledger.sqlite3") as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"),
                             source="appserver:x", at=1.0)])
        intent = intent_requests.propose(rec, thread_id="T1", mode="queue", text="hi", owner="ann")
    (root / "sessions").mkdir()
    (root / "sessions" / "s.jsonl").write_text("")
    (root / "dir").mkdir()
    os.mkfifo(root / "fifo")
    (root / "ledger.sqlite3.lock").write_text("1")
    (root / "to-ledger").symlink_to(root / "ledger.sqlite3")
    (root / "to-anchor").symlink_to(root / "ledger.sqlite3.head")
    monkeypatch.setattr("tillerman.controller.daemon.daemon.run_daemon", lambda *args: None)
    monkeypatch.setattr("tillerman.controller.codex.shim.run_shim", _no_shim)
    return root, intent.id


async def _no_shim(socket_path: str) -> None:
    raise OSError("the fuzz test starts no shim")


def _state(root: Path) -> tuple[int, frozenset[str], bytes, bytes]:
    """The ledger's last seq, the names in the folder, and its anchor and lock files' bytes."""
    with SQLiteRecorder(root / "ledger.sqlite3") as rec:
        last = rec.max_seq()
    names = frozenset(str(p.relative_to(root)) for p in root.rglob("*")
                      if not p.name.endswith(("-wal", "-shm", ".head", ".lock")))
    return last, names, (root / "ledger.sqlite3.head").read_bytes(), (root / "ledger.sqlite3.lock").read_bytes()


def _blocked(signum, frame):
    raise TimeoutError("the command blocked (a FIFO opened for writing?)")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_hostile_options_never_traceback_and_an_error_writes_nothing(place, name):
    root, intent_id = place

    @settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(command_lines(name))
    def check(args):
        args = [intent_id if a == "INTENT" else a for a in args]
        before = _state(root)
        previous = signal.signal(signal.SIGALRM, _blocked)
        signal.alarm(30)
        try:
            result = CliRunner().invoke(main, args)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
        assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)
        assert "Traceback" not in result.output, (args, result.output)
        if _writes_to_a_hostile_output(name, args):
            assert result.exit_code == 2, (args, result.output)
        if result.exit_code == 2:
            assert _state(root) == before, (args, result.output)

    check()
