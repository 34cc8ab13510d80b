"""Retention: ``ledger archive --before T`` moves the rows of threads closed before T into
a segment; the chain still verifies end to end through it, every edit or removal in
either file is named, export and replay read the whole history, the live file shrinks,
and a crash at any step leaves a ledger that verifies and that a second run finishes."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from tests.faults.ledger_faults import run_cli
from tillerman.controller.cli.main import main
from tillerman.controller.dispatch.driver import KILL_AT_ENV
from tillerman.ledger import projections
from tillerman.ledger.archive import CHECKPOINTS, archive
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.events import (
    AgentMessage,
    Envelope,
    IntentProposed,
    IntentTransition,
    LedgerArchived,
    RulesetLoaded,
    TurnStarted,
)
from tillerman.ledger.intents import Intent
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.segments import segment_dir
from tillerman.ledger.sqlite import SQLiteRecorder

BEFORE = "1970-01-01T00:08:20Z"  # 500 s: threads last active before it are closed
MOVED_THREADS = {"t-old", "t-old2"}


def at(i: int, event, when: float, source: str = "test") -> Envelope:
    return Envelope(event_id=f"e{i}", event=event, source=source, at=float(when), observed_at=float(when))


def intent(intent_id: str, thread: str, when: float) -> Intent:
    return Intent(id=intent_id, thread_id=thread, mode="queue", text="x", text_digest="d", created_at=when,
                  ack_deadline=when + 10, expires_at=when + 100)


def history_ledger(path: Path) -> Path:
    """t-old (closed, with a cancelled intent) and t-old2 move; t-open (an open intent)
    and t-new (active after T) stay, and so does the rule set, which has no thread."""
    old, pending = intent("in-old", "t-old", 13), intent("in-open", "t-open", 17)
    with SQLiteRecorder(path) as rec:
        rec.append([
            at(1, TurnStarted(thread_id="t-old", turn_id="u1"), 10),
            at(2, TurnStarted(thread_id="t-open", turn_id="u2"), 11),
            at(3, TurnStarted(thread_id="t-old", turn_id="u3"), 12),
            at(4, IntentProposed(thread_id="t-old", intent=old), 13, "tillerman"),
            at(5, IntentTransition(thread_id="t-old", intent_id=old.id, from_state="proposed",
                                   to_state="expired", reason="cancelled"), 14, "tillerman"),
            at(6, TurnStarted(thread_id="t-new", turn_id="u6"), 15),
            at(7, IntentProposed(thread_id="t-open", intent=pending), 17, "tillerman"),
            at(8, RulesetLoaded(digest="r1", rules=1), 19, "tillerman"),
            at(9, TurnStarted(thread_id="t-old2", turn_id="u9"), 20),
            at(10, TurnStarted(thread_id="t-new", turn_id="u10"), 1000),
        ])
    return path


@pytest.fixture
def ledger(tmp_path) -> Path:
    return history_ledger(tmp_path / "l.sqlite3")


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def export(path: Path) -> list[dict]:
    result = cli("ledger", "export", "--ledger", str(path))
    assert result.exit_code == 0, result.output
    return [msgspec.json.decode(line) for line in result.output.splitlines()]


def live_seqs(path: Path) -> list[int]:
    with SQLiteRecorder(path, readonly=True) as rec:
        return [e.seq for e in rec.read()]


def the_segment(path: Path) -> Path:
    (segment,) = segment_dir(path).glob("seq-*.sqlite3")
    return segment


def run_sql(path: Path, *statements: str) -> None:
    db = sqlite3.connect(path)
    for sql in statements:
        db.execute(sql)
    db.commit()
    db.close()


def verify(path: Path):
    return cli("ledger", "verify", "--ledger", str(path))


# -- what moves -----------------------------------------------------------------------------------


def test_closed_threads_move_with_their_terminal_intents_and_nothing_an_open_intent_needs(ledger):
    before = export(ledger)
    result = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger), "--json")
    assert result.exit_code == 0, result.output
    report = msgspec.json.decode(result.output)
    assert (report["threads"], report["intents"], report["rows"], report["kept_threads"]) == (2, 1, 5, 1)
    assert (report["first_seq"], report["last_seq"], report["record_seq"]) == (1, 9, 11)
    assert live_seqs(ledger) == [2, 6, 7, 8, 10, 11]  # t-open, t-new, the rule set, the record
    with SQLiteRecorder(the_segment(ledger), readonly=True) as segment:
        moved = list(segment.read())
    assert [e.seq for e in moved] == [1, 3, 4, 5, 9]
    assert {e.envelope.event.thread_id for e in moved} == MOVED_THREADS
    with SQLiteRecorder(ledger, readonly=True) as rec:
        projection = projections.load(rec)
    assert set(projection.threads) == {"t-open", "t-new"}
    assert [v.intent.id for v in projection.open_intents()] == ["in-open"]
    # the whole history, in seq order, is what it was, plus the record of the archive
    after = export(ledger)
    assert after[:-1] == before
    assert after[-1]["envelope"]["event"]["kind"] == "ledger_archived"
    assert verify(ledger).exit_code == 0


def test_a_row_whose_key_was_held_by_a_moved_one_takes_it_and_is_still_refused_twice(tmp_path, monkeypatch):
    """Ids that share a key (``tillerman.ledger.event_keys``): the later one is stored
    without it. When the archive moves the one that held it, the one that stays takes
    the key, so offering it again is still a duplicate."""
    from tillerman.ledger import sqlite as sqlite_ledger

    monkeypatch.setattr(sqlite_ledger, "event_key", lambda event_id: 7 if event_id in ("e1", "e2") else hash(event_id))
    ledger = history_ledger(tmp_path / "l.sqlite3")  # e1 (t-old, moves) holds the key e2 (t-open) shares
    keyed = dict(sqlite3.connect(ledger).execute("SELECT event_id, id_key FROM events"))
    assert (keyed["e1"], keyed["e2"]) == (7, None)
    assert cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger)).exit_code == 0
    keyed = dict(sqlite3.connect(ledger).execute("SELECT event_id, id_key FROM events"))
    assert "e1" not in keyed and keyed["e2"] == 7
    with SQLiteRecorder(ledger) as rec:
        assert rec.append([at(2, TurnStarted(thread_id="t-open", turn_id="u2"), 11)]).duplicates == 1
    assert verify(ledger).exit_code == 0


def test_a_second_run_moves_nothing_and_a_dry_run_changes_nothing(ledger):
    dry = cli("ledger", "archive", "--before", BEFORE, "--dry-run", "--ledger", str(ledger))
    assert dry.exit_code == 0 and dry.output.startswith("would archive 2 thread(s), 1 intent(s), 5 row(s)")
    assert live_seqs(ledger) == list(range(1, 11)) and not segment_dir(ledger).exists()
    first = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger))
    assert first.exit_code == 0 and "archived 2 thread(s)" in first.output, first.output
    again = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger))
    assert again.exit_code == 0 and again.output.startswith("nothing to archive"), again.output
    assert "1 closed thread(s) kept for an open intent" in again.output
    assert len(list(segment_dir(ledger).iterdir())) == 1 and verify(ledger).exit_code == 0


def test_a_thread_with_a_row_after_t_or_an_open_intent_stays(ledger):
    result = archive(ledger, 12.5)  # t-old's intent rows come after 12.5: nothing of it moves
    assert (result.threads, result.rows) == (0, 0)
    result = archive(ledger, 10**6)  # everything closed; t-open stays for its open intent
    assert result.threads == 3 and live_seqs(ledger) == [2, 7, 8, 11]


# -- refusals -------------------------------------------------------------------------------------


def test_refused_while_a_daemon_owns_the_ledger(ledger):
    with LedgerLock(ledger):
        result = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger))
    assert result.exit_code == 2
    assert "owns" in result.output and "stop it before archiving" in result.output
    assert live_seqs(ledger) == list(range(1, 11))


def test_refused_on_a_ledger_that_does_not_verify(ledger):
    run_sql(ledger, "UPDATE events SET source = 'forged' WHERE seq = 3")
    result = cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger))
    assert result.exit_code == 1 and "does not verify (seq 3" in result.output
    assert not segment_dir(ledger).exists()


def test_a_bad_time_is_a_usage_error(ledger):
    result = cli("ledger", "archive", "--before", "yesterday", "--ledger", str(ledger))
    assert result.exit_code == 2 and "--before 'yesterday' is not an ISO-8601 time" in result.output


def test_a_write_to_a_moving_thread_during_the_archive_cancels_it(ledger):
    def meanwhile(point: str) -> None:
        if point == "segment_placed":  # an `intent propose` or a late event, between plan and commit
            with SQLiteRecorder(ledger) as rec:
                rec.append([at(99, TurnStarted(thread_id="t-old", turn_id="late"), 30)])

    with pytest.raises(OperationalError, match="was written to while archiving"):
        archive(ledger, 500, checkpoint=meanwhile)
    assert live_seqs(ledger) == list(range(1, 12))
    assert not list(segment_dir(ledger).glob("seq-*")) and verify(ledger).exit_code == 0


def test_a_segment_is_never_opened_for_writing(ledger):
    archive(ledger, 500)
    result = cli("intent", "propose", "--ledger", str(the_segment(ledger)), "--thread", "t-old",
                 "--mode", "queue", "--text", "x", "--owner", "ann")
    assert result.exit_code == 2 and "archive segment" in result.output


# -- verify spans the segments ---------------------------------------------------------------------


def test_verify_walks_the_chain_through_the_segment(ledger):
    archive(ledger, 500)
    result = verify(ledger)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok: 11 rows, last seq 11")
    assert "seq 11: 5 row(s) of 2 thread(s) closed before 1970-01-01T00:08:20Z are in the archive segment" \
        in result.output
    alone = verify(the_segment(ledger))
    assert alone.exit_code == 0 and alone.output.startswith("ok: 5 rows, last seq 9"), alone.output


def _move_row_back(ledger: Path) -> None:
    """Take seq 3 out of the segment and put it back into the live file, unchanged."""
    segment = the_segment(ledger)
    db = sqlite3.connect(ledger)
    db.execute(f"ATTACH '{segment}' AS seg")
    db.execute("INSERT INTO main.events SELECT * FROM seg.events WHERE seq = 3")
    db.execute("DELETE FROM seg.events WHERE seq = 3")
    db.commit()
    db.close()


@pytest.mark.parametrize(("damage", "named"), [
    (lambda l: run_sql(the_segment(l), "DELETE FROM events WHERE seq = 4"), "seq 5: expected seq 4"),
    (lambda l: run_sql(the_segment(l), "UPDATE events SET at = 99 WHERE seq = 3"), "seq 3: content digest"),
    (lambda l: run_sql(l, "DELETE FROM events WHERE seq = 6"), "seq 7: expected seq 6"),
    (lambda l: run_sql(l, "UPDATE events SET source = 'x' WHERE seq = 7"), "seq 7: content digest"),
    (_move_row_back, "holds 4 row(s), seqs 1..9"),
    (lambda l: the_segment(l).unlink(), "is missing; restore it from a backup"),
    (lambda l: run_sql(l, "UPDATE events SET payload = replace(payload, '\"rows\":5', '\"rows\":4')"
                          " WHERE kind = 'ledger_archived'"), "seq 11: content digest"),
], ids=["segment-row-removed", "segment-row-edited", "live-row-removed", "live-row-edited", "row-moved-back",
        "segment-missing", "record-edited"])
def test_a_row_removed_edited_or_moved_in_either_file_is_named(ledger, damage, named):
    archive(ledger, 500)
    damage(ledger)
    result = verify(ledger)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("DAMAGED") and named in result.output, result.output


def test_a_segment_alone_names_an_edited_row(ledger):
    archive(ledger, 500)
    run_sql(the_segment(ledger), "UPDATE events SET at = 99 WHERE seq = 4")
    result = verify(the_segment(ledger))
    assert result.exit_code == 1 and "seq 4: content digest mismatch" in result.output


def test_a_fold_snapshot_saved_after_the_archive_verifies(ledger):
    archive(ledger, 500)
    with SQLiteRecorder(ledger) as rec:  # what a daemon starting on the archived ledger saves, and goes on
        projections.save(rec, projections.load(rec))
        assert rec.load_snapshot(projections.SNAPSHOT_NAME)[0] == 11
        rec.append([at(11, TurnStarted(thread_id="t-new", turn_id="u11"), 1001)])
    # the fold to check it against is of the rows up to seq 11 (six of them), not of eleven rows
    result = verify(ledger)
    assert result.exit_code == 0, result.output


# -- export and replay read the segments ----------------------------------------------------------


def test_replay_of_the_archived_ledger_sees_the_whole_history(ledger, tmp_path):
    copy = tmp_path / "before.sqlite3"
    for suffix in ("", ".head"):
        shutil.copy(f"{ledger}{suffix}", f"{copy}{suffix}")
    archive(ledger, 500)

    def replayed(path: Path) -> dict:
        result = cli("replay", "--json", str(path))
        assert result.exit_code == 0, result.output
        return msgspec.json.decode(result.output)

    before, after = replayed(copy), replayed(ledger)
    assert after["events"] == before["events"] == 6  # the observations, archived or not
    assert after["decisions_digest"] == before["decisions_digest"]
    with SQLiteRecorder(ledger, readonly=True) as rec:
        assert [e.seq for e in rec.history(after_seq=4)] == [5, 6, 7, 8, 9, 10, 11]
        assert [e.seq for e in rec.history(kinds=("turn_started",))] == [1, 2, 3, 6, 9, 10]


# -- the file shrinks ------------------------------------------------------------------------------


def many_threads(path: Path, threads: int, closed: int, rows: int = 40) -> Path:
    """``threads`` threads of ``rows`` agent messages keeping 400 bytes of text each; the
    first ``closed`` of them end before 5000 s."""
    text = "lorem ipsum " * 33
    with SQLiteRecorder(path) as rec:
        for thread in range(threads):
            when = 100.0 if thread < closed else 10_000.0
            rec.append([at(thread * 100 + i, AgentMessage(thread_id=f"t{thread}", turn_id="u", digest="d",
                                                           size=len(text), text=text), when + i)
                        for i in range(rows)])
    return path


def test_the_live_file_shrinks(tmp_path):
    """200 threads of 40 rows; the 180 closed ones move."""
    path = many_threads(tmp_path / "big.sqlite3", 200, 180)
    result = archive(path, 5_000)
    assert (result.threads, result.rows) == (180, 7200)
    assert result.bytes_after < result.bytes_before / 5, (result.bytes_before, result.bytes_after)
    assert result.bytes_after == path.stat().st_size  # the WAL is emptied into the file
    assert verify(path).exit_code == 0
    print(f"\nlive ledger {result.bytes_before:,} -> {result.bytes_after:,} bytes;"
          f" segment {Path(result.segment).stat().st_size:,} bytes")


# -- a crash at each step --------------------------------------------------------------------------


def _state(path: Path) -> tuple[list[int], list[list[int]]]:
    segments = []
    for segment in sorted(segment_dir(path).glob("seq-*.sqlite3")):
        with SQLiteRecorder(segment, readonly=True) as rec:
            segments.append([e.seq for e in rec.read()])
    return live_seqs(path), segments


@pytest.mark.parametrize("point", CHECKPOINTS)
def test_a_crash_at_each_step_verifies_and_a_second_run_finishes(tmp_path, point):
    clean = history_ledger(tmp_path / "clean.sqlite3")
    assert run_cli("ledger", "archive", "--before", BEFORE, "--ledger", str(clean)).returncode == 0
    ledger = history_ledger(tmp_path / "l.sqlite3")
    killed = run_cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger), env={KILL_AT_ENV: point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    checked = run_cli("ledger", "verify", "--ledger", str(ledger))
    assert checked.returncode == 0, checked.stdout
    again = run_cli("ledger", "archive", "--before", BEFORE, "--ledger", str(ledger))
    assert again.returncode == 0, again.stderr
    assert run_cli("ledger", "verify", "--ledger", str(ledger)).returncode == 0
    assert _state(ledger) == _state(clean)
    with SQLiteRecorder(ledger, readonly=True) as rec:
        assert rec.free_pages() == 0
        (record,) = [e.envelope.event for e in rec.read() if isinstance(e.envelope.event, LedgerArchived)]
    assert record.rows == 5


def test_a_second_run_finishes_an_archive_stopped_before_its_vacuum(tmp_path):
    path = many_threads(tmp_path / "l.sqlite3", 20, 15)

    def stop(point: str) -> None:
        if point == "anchor_moved":
            raise KeyboardInterrupt  # as a crash there would: committed, not vacuumed

    with pytest.raises(KeyboardInterrupt):
        archive(path, 5_000, checkpoint=stop)
    with SQLiteRecorder(path, readonly=True) as rec:
        assert rec.free_pages() > 0
    assert verify(path).exit_code == 0
    again = archive(path, 5_000)
    assert again.rows == 0 and again.bytes_after < again.bytes_before
    with SQLiteRecorder(path, readonly=True) as rec:
        assert rec.free_pages() == 0
