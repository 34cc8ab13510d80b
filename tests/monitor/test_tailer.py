"""The file tailer (tillerman.monitor.tailer) driven by hand into a SQLite ledger: partial lines,
resumable offsets, generations (truncation, replacement, rotation, deletion), hostile
input, and live == replay."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil

import pytest

from tests.monitor.tailer_support import (
    SESSIONS,
    THREAD,
    append,
    chmod_works,
    drive,
    facts,
    gone,
    offsets_by_source,
    quarantines,
    replayed,
    restart,
    rollout_line,
    rollout_name,
    session_meta,
)
from tillerman.ledger import events as ev
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor import tailer as tailer_module
from tillerman.monitor.tailer import FILE_DELETED, FILE_TRUNCATED, SYMLINK_LOOP, UNKNOWN_FORMAT, UNREADABLE, Tailer


@pytest.fixture
def ledger(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as rec:
        yield rec


@pytest.fixture
def rollout(tmp_path):
    (tmp_path / "sessions").mkdir()
    return tmp_path / "sessions" / rollout_name()


def _row(ledger, path):
    """The generation at ``path``: the one followed there now if any (rows come in identity
    order, and a replacement's inode may sort before its predecessor's), else the last."""
    rows = [r for r in ledger.file_offsets() if r.path == str(path)]
    following = [r for r in rows if r.state == "following"]
    return (following or rows)[-1] if rows else None


# -- partial lines and offsets ---------------------------------------------------------


def test_a_partial_last_line_is_held_until_its_newline(ledger, rollout):
    tailer = Tailer()
    line = rollout_line(1)
    append(rollout, session_meta() + line[:20])
    drive(tailer, ledger, rollout)
    assert [e.envelope.offset for e in ledger.read()] == [0]  # thread_started only
    assert _row(ledger, rollout).offset == len(session_meta())  # never past the partial line
    append(rollout, line[20:-1])  # still no newline
    drive(tailer, ledger, rollout)
    assert _row(ledger, rollout).offset == len(session_meta())
    assert ledger.max_seq() == 1
    append(rollout, b"\n")
    drive(tailer, ledger, rollout)
    last = list(ledger.read())[-1].envelope
    assert (last.offset, last.length) == (len(session_meta()), len(line))
    assert isinstance(last.event, ev.AgentMessage) and last.event.thread_id == THREAD
    assert _row(ledger, rollout).offset == len(session_meta()) + len(line)


def test_the_identity_waits_for_a_complete_first_line(ledger, rollout):
    tailer = Tailer()
    meta = session_meta()
    append(rollout, meta[:30])
    drive(tailer, ledger, rollout)
    assert ledger.file_offsets() == [] and ledger.max_seq() == 0
    append(rollout, meta[30:] + rollout_line(1))
    drive(tailer, ledger, rollout)
    assert facts(ledger) == replayed(rollout)


def test_offsets_resume_after_a_restart_without_loss_or_repeat(tmp_path, rollout):
    path = tmp_path / "ledger.sqlite3"
    lines = [rollout_line(0, "task_started", turn_id="turn-1")] + [rollout_line(i) for i in range(1, 30)]
    append(rollout, session_meta() + b"".join(lines[:10]) + lines[10][:7])
    with SQLiteRecorder(path) as ledger:
        drive(Tailer(), ledger, rollout)
        first = ledger.max_seq()
    append(rollout, lines[10][7:] + b"".join(lines[11:20]))
    with SQLiteRecorder(path) as ledger:  # a new process: only the ledger remembers
        tailer = restart(ledger)
        assert drive(tailer, ledger, rollout) == 0  # nothing offered twice: it resumed at the offset
        assert ledger.max_seq() == first + 10
        append(rollout, b"".join(lines[20:]))
        assert drive(tailer, ledger, rollout) == 0
        assert facts(ledger) == replayed(rollout)  # the parser's context (the open turn) survived the restart
        assert list(ledger.read())[-1].envelope.event.turn_id == "turn-1"
        assert _row(ledger, rollout).offset == rollout.stat().st_size


def test_a_restart_with_nothing_new_reads_nothing(ledger, rollout, monkeypatch):
    append(rollout, session_meta() + rollout_line(1))
    drive(Tailer(), ledger, rollout)
    tailer = restart(ledger)
    reads = []
    real = tailer_module._pread
    monkeypatch.setattr(tailer_module, "_pread", lambda fd, size, offset: reads.append(offset) or real(fd, size, offset))
    drive(tailer, ledger, rollout)
    assert reads == [0]  # the head, for the identity; no re-read of the body
    reads.clear()
    append(rollout, rollout_line(2))
    drive(tailer, ledger, rollout)
    assert facts(ledger) == replayed(rollout)


def test_changes_never_reread_the_file_from_its_start(ledger, rollout, monkeypatch):
    tailer = Tailer()
    append(rollout, session_meta())
    drive(tailer, ledger, rollout)
    reads = []
    real = tailer_module._pread
    monkeypatch.setattr(tailer_module, "_pread", lambda fd, size, offset: reads.append((offset, size)) or real(fd, size, offset))
    for i in range(5):
        append(rollout, rollout_line(i))
        drive(tailer, ledger, rollout)
    body = [r for r in reads if r[0] != 0]
    assert all(size <= len(session_meta()) for offset, size in reads if offset == 0)  # first-line check only
    assert len(body) >= 5


# -- generations -------------------------------------------------------------------------


def test_truncation_is_recorded_and_the_file_read_again_as_a_new_generation(ledger, rollout):
    tailer = Tailer()
    append(rollout, session_meta() + rollout_line(1) + rollout_line(2))
    drive(tailer, ledger, rollout)
    before = ledger.max_seq()
    old = _row(ledger, rollout).identity
    with open(rollout, "wb") as fh:  # truncate in place (same inode) and write another session
        fh.write(session_meta("01a229c4-3717-7c10-9d2e-5b7f0c9e1a02") + rollout_line(9))
    drive(tailer, ledger, rollout)
    truncated = [q for q in quarantines(ledger) if q.reason == FILE_TRUNCATED]
    assert len(truncated) == 1 and truncated[0].length == len(session_meta() + rollout_line(1) + rollout_line(2))
    rows = {r.identity: r for r in ledger.file_offsets()}
    new = _row(ledger, rollout)
    assert new.identity != old and rows[old].state == "replaced"
    assert new.offset == rollout.stat().st_size and new.state == "following"
    assert ledger.max_seq() == before + 1 + 2  # the evidence, then thread_started and the message
    assert not [e for e in ledger.read() if isinstance(e.envelope.event, ev.Conflict)]


def test_truncation_to_the_same_first_line_rereads_without_duplicates(ledger, rollout):
    tailer = Tailer()
    append(rollout, session_meta() + rollout_line(1) + rollout_line(2))
    drive(tailer, ledger, rollout)
    n = ledger.max_seq()
    with open(rollout, "r+b") as fh:  # cut back to the first two lines: same identity
        fh.truncate(len(session_meta() + rollout_line(1)))
    drive(tailer, ledger, rollout)
    assert ledger.max_seq() == n + 1  # only the truncation evidence; the re-read lines are no-ops
    append(rollout, rollout_line(2) + rollout_line(3))  # the writer carries on
    drive(tailer, ledger, rollout)
    assert ledger.max_seq() == n + 2
    assert not [e for e in ledger.read() if isinstance(e.envelope.event, ev.Conflict)]


def test_truncation_while_not_running_is_caught_at_restart(tmp_path, rollout):
    path = tmp_path / "ledger.sqlite3"
    append(rollout, session_meta() + rollout_line(1) + rollout_line(2))
    with SQLiteRecorder(path) as ledger:
        drive(Tailer(), ledger, rollout)
    with open(rollout, "r+b") as fh:
        fh.truncate(len(session_meta()))
    append(rollout, rollout_line(5))
    with SQLiteRecorder(path) as ledger:
        drive(restart(ledger), ledger, rollout)
        assert [q.reason for q in quarantines(ledger)] == [FILE_TRUNCATED]
        assert _row(ledger, rollout).offset == rollout.stat().st_size


def test_a_replaced_file_is_a_new_generation_read_from_its_start(ledger, rollout, tmp_path):
    tailer = Tailer()
    append(rollout, session_meta() + rollout_line(1))
    drive(tailer, ledger, rollout)
    old = _row(ledger, rollout)
    other = tmp_path / "other.tmp"
    other.write_bytes(session_meta() + rollout_line(1) + rollout_line(2))  # same first line, new inode
    os.replace(other, rollout)
    drive(tailer, ledger, rollout)
    rows = {r.identity: r for r in ledger.file_offsets()}
    new = _row(ledger, rollout)
    assert rows[old.identity].state == "replaced" and new.identity != old.identity
    assert new.offset == rollout.stat().st_size
    assert len(facts(ledger)) == 2 + 3  # both generations, each read whole, nothing twice


def test_a_rotated_file_is_followed_on_under_its_new_name(ledger, rollout):
    tailer = Tailer()
    append(rollout, session_meta() + rollout_line(1))
    drive(tailer, ledger, rollout)
    rotated = rollout.with_name(rollout.stem + "-1.jsonl")
    os.rename(rollout, rotated)
    append(rotated, rollout_line(2))  # the old writer still had it open
    append(rollout, session_meta("01a229c4-3717-7c10-9d2e-5b7f0c9e1a02") + rollout_line(1))
    drive(tailer, ledger, rotated, rollout)
    gone(tailer, ledger, rollout.with_name("never-there.jsonl"))
    by_source = offsets_by_source(ledger)
    # the rotated generation keeps its source; it gained exactly the appended line
    assert sorted(by_source[f"file:{rollout}"]) == sorted([0, len(session_meta()), 0,
                                                           len(session_meta() + rollout_line(1)),
                                                           len(session_meta())])
    assert f"file:{rotated}" not in by_source
    assert not [q for q in quarantines(ledger) if q.reason == FILE_DELETED]
    assert {r.state for r in ledger.file_offsets()} == {"following"}
    assert not [e for e in ledger.read() if isinstance(e.envelope.event, ev.Conflict)]


def test_a_deleted_file_is_recorded_with_its_unread_partial_line(ledger, rollout):
    tailer = Tailer()
    append(rollout, session_meta() + rollout_line(1) + b'{"partial')
    drive(tailer, ledger, rollout)
    rollout.unlink()
    gone(tailer, ledger, rollout)
    deleted = [q for q in quarantines(ledger) if q.reason == FILE_DELETED]
    assert len(deleted) == 1
    assert (deleted[0].offset, deleted[0].length) == (len(session_meta() + rollout_line(1)), len(b'{"partial'))
    assert _row(ledger, rollout).state == "deleted"
    drive(tailer, ledger, rollout)  # polling the missing path again records nothing new
    assert len([q for q in quarantines(ledger) if q.reason == FILE_DELETED]) == 1


def test_a_file_deleted_while_not_running_is_recorded_at_restart(ledger, rollout, tmp_path):
    append(rollout, session_meta() + rollout_line(1))
    drive(Tailer(), ledger, rollout)
    rollout.unlink()
    tailer = restart(ledger)
    for batch in tailer.forget_missing(present=set()):
        ledger.append(batch.envelopes, offsets=batch.offsets)
    assert [q.reason for q in quarantines(ledger)] == [FILE_DELETED]
    assert _row(ledger, rollout).state == "deleted"
    assert list(restart(ledger).forget_missing(set())) == []  # recorded once


# -- hostile input ----------------------------------------------------------------------------


def test_hostile_lines_are_quarantined_and_following_goes_on(ledger, rollout):
    tailer = Tailer(max_line=256)
    bad = [
        b'{"timestamp": "2026-11-30T00:00:01Z", "type": "event_msg", "payl\n',  # truncated JSON
        b'{"type": "event_msg", "payload": {"type": "agent_message", "message": "\xff\xfe"}}\n',  # invalid UTF-8
        b'{"type": "event_msg",\x00 "payload": {}}\n',  # NUL bytes
        b'{"x": "' + b"a" * 1000 + b'"}\n',  # over the configured maximum
        bytes(range(1, 256)).replace(b"\n", b"") + b"\n",  # binary garbage
        b'{"type": "event_msg", "payload": {"type": "agent_message", "message": 42}}\n',  # wrong type
        b'[1, 2, 3]\n',  # not an object
    ]
    append(rollout, session_meta())
    for line in bad:
        append(rollout, line)
        drive(tailer, ledger, rollout)
    append(rollout, rollout_line(1))
    drive(tailer, ledger, rollout)
    reasons = [q.reason for q in quarantines(ledger)]
    assert reasons == ["truncated", "invalid_utf8", "nul_bytes", "line_too_long", "invalid_json", "wrong_type",
                       "not_an_object"]
    q = quarantines(ledger)
    assert all(x.source == f"file:{rollout}" for x in q)
    assert [(x.offset, x.length) for x in q] == [
        (len(session_meta() + b"".join(bad[:i])), len(bad[i])) for i in range(len(bad))]
    assert isinstance(list(ledger.read())[-1].envelope.event, ev.AgentMessage)


def test_deeply_nested_json_is_quarantined_with_its_byte_range_and_following_goes_on(ledger, rollout, caplog):
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n"
    append(rollout, session_meta() + deep + rollout_line(1))  # read in one chunk with its neighbours
    drive(Tailer(), ledger, rollout)
    assert [(q.reason, q.offset, q.length) for q in quarantines(ledger)] == [
        ("too_deep", len(session_meta()), len(deep))]
    assert isinstance(list(ledger.read())[-1].envelope.event, ev.AgentMessage)  # the line after it is read
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_an_unreadable_file_is_quarantined_and_the_others_still_followed(ledger, rollout, tmp_path, monkeypatch):
    locked = rollout.with_name("locked.jsonl")
    locked.write_bytes(session_meta())
    append(rollout, session_meta())
    real_open = os.open

    def refusing(path, flags, *args):
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(tailer_module.os, "open", refusing)
    tailer = Tailer()
    drive(tailer, ledger, locked, rollout)
    drive(tailer, ledger, locked)  # logged and recorded once
    assert [(q.reason, q.source) for q in quarantines(ledger)] == [(UNREADABLE, f"file:{locked}")]
    append(rollout, rollout_line(1))
    drive(tailer, ledger, rollout)
    assert isinstance(list(ledger.read())[-1].envelope.event, ev.AgentMessage)
    monkeypatch.setattr(tailer_module.os, "open", real_open)  # readable again: followed from its start
    drive(tailer, ledger, locked)
    assert any(e.envelope.source == f"file:{locked}" and isinstance(e.envelope.event, ev.ThreadStarted)
               for e in ledger.read())


@pytest.mark.skipif(not chmod_works(), reason="root reads files without read permission")
def test_a_file_without_read_permission(ledger, rollout):
    append(rollout, session_meta())
    rollout.chmod(0)
    drive(Tailer(), ledger, rollout)
    assert [q.reason for q in quarantines(ledger)] == [UNREADABLE]


def test_a_symlink_loop_is_quarantined_and_other_symlinks_are_not_followed(ledger, rollout, tmp_path):
    append(rollout, session_meta())
    loop_a, loop_b = rollout.with_name("a.jsonl"), rollout.with_name("b.jsonl")
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    link = rollout.with_name("link.jsonl")
    os.symlink(rollout, link)
    tailer = Tailer()
    drive(tailer, ledger, loop_a, link, rollout)
    assert [q.reason for q in quarantines(ledger)] == [SYMLINK_LOOP]
    assert {e.envelope.source for e in ledger.read()} == {f"file:{loop_a}", f"file:{rollout}"}


def test_a_file_of_unknown_format_is_recorded_once_and_not_followed(ledger, tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(b'{"hello": "world"}\n' + b"x" * (70 * 1024) + b"\n")
    tailer = Tailer()
    drive(tailer, ledger, path)
    append(path, b'{"more": 1}\n')
    drive(tailer, ledger, path)
    assert [q.reason for q in quarantines(ledger)] == [UNKNOWN_FORMAT]
    assert ledger.file_offsets() == []


def test_a_fifo_is_not_opened(ledger, tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    drive(Tailer(), ledger, fifo)  # would block forever if opened for reading
    assert ledger.max_seq() == 0


# -- live == replay -------------------------------------------------------------------------------

FIXTURES = sorted(p for p in SESSIONS.rglob("*.jsonl") if p.is_file())


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: str(p.relative_to(SESSIONS)))
def test_a_file_followed_live_gives_the_same_envelopes_as_replay(ledger, tmp_path, fixture):
    target = tmp_path / "watched" / fixture.relative_to(SESSIONS)
    target.parent.mkdir(parents=True)
    data = fixture.read_bytes()
    rng = random.Random(str(fixture))
    tailer = Tailer()
    start = 0
    while start < len(data):  # written in pieces that cut lines anywhere, polled between pieces
        end = min(len(data), start + rng.randint(1, 4096))
        append(target, data[start:end])
        drive(tailer, ledger, target)
        start = end
    live = facts(ledger)
    offline = replayed(target)
    if data.endswith(b"\n"):
        assert live == offline
    else:  # replay reads the unterminated tail at the end of input; live holds it
        tail = data.rfind(b"\n") + 1
        assert live == [f for f in offline if f[4] < tail]
    assert _row(ledger, target).offset == data.rfind(b"\n") + 1


def test_a_copied_fixture_tree_equals_replay_of_the_tree(ledger, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(SESSIONS, tree)
    tailer = Tailer()
    for path in tailer_module.scan([str(tree)]):
        drive(tailer, ledger, path)
    complete = [f for p in sorted(tree.rglob("*.jsonl")) for f in replayed(p)
                if f[4] < p.read_bytes().rfind(b"\n") + 1]  # live holds an unterminated tail
    assert sorted(facts(ledger)) == sorted(complete)


def test_reloaded_patterns_reach_files_already_open(ledger, rollout):
    """A configuration reload re-classifies commands in files the tailer already follows."""
    tailer = Tailer()
    append(rollout, session_meta())
    drive(tailer, ledger, rollout)

    def call(call_id: str) -> bytes:
        return (json.dumps({"timestamp": "2026-11-30T00:05:00.000Z", "type": "response_item", "payload": {
            "type": "function_call", "name": "shell", "call_id": call_id,
            "arguments": json.dumps({"command": ["bash", "-lc", "frobnicate --all"]})}}) + "\n").encode()

    append(rollout, call("c1"))
    drive(tailer, ledger, rollout)
    tailer.use_patterns(CommandPatterns(critical=(r"\bfrobnicate\b",), external=()))
    append(rollout, call("c2"))
    drive(tailer, ledger, rollout)
    started = {e.envelope.event.item_id: e.envelope.event.critical for e in ledger.read()
               if isinstance(e.envelope.event, ev.ItemStarted)}
    assert started == {"c1": False, "c2": True}
