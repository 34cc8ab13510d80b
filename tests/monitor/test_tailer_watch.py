"""The watchfiles driver (tillerman.monitor.watch) and ``tillerman run --watch``: files and
directories that appear after start, a watched directory that does not exist yet (or is
removed) followed once it appears, deletion and rotation seen by the watcher, a
files-only daemon (no app-server) whose threads are not steerable, and live == replay
through the whole daemon."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import anyio
from click.testing import CliRunner

from tests.monitor.tailer_support import (
    SESSIONS,
    append,
    facts,
    quarantines,
    replayed,
    rollout_line,
    rollout_name,
    session_meta,
)
from tillerman.controller.cli.main import _daemon_lines, main
from tillerman.controller.cli.status import ledger_status
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.tailer import FILE_DELETED, Tailer
from tillerman.monitor.watch import Watch
from tillerman.rules.files import default_ruleset

TIMEOUT = 10.0


async def _until(predicate, timeout: float = TIMEOUT) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def _watching(root, body, *, known=(), also=(), **options):
    """Run a Watch over ``root`` (and the folders ``also``) recording into a fresh ledger
    while ``body(ledger)`` runs."""
    ledger = SQLiteRecorder(root.parent / "ledger.sqlite3")

    async def send(batch):
        ledger.append(batch.envelopes, offsets=batch.offsets)

    async def run():
        async with anyio.create_task_group() as tg:
            watch = Watch([str(root), *map(str, also)], Tailer(known=known or ledger.file_offsets()), send, **options)
            await tg.start(watch.run)
            await body(ledger)
            tg.cancel_scope.cancel()

    try:
        anyio.run(run)
    finally:
        ledger.close()


def _sessions_with_a_rollout(tmp_path):
    """A sessions folder holding one rollout file with its session line and one fact: (folder, file)."""
    root = tmp_path / "sessions"
    root.mkdir()
    path = root / rollout_name()
    append(path, session_meta() + rollout_line(1))
    return root, path


def test_files_and_directories_that_appear_after_start_are_followed(tmp_path):
    root = tmp_path / "sessions"
    root.mkdir()

    async def body(ledger):
        await anyio.sleep(0.2)
        day = root / "2026" / "11" / "30"
        day.mkdir(parents=True)  # a new day's folder, written into at once
        path = day / rollout_name()
        append(path, session_meta() + rollout_line(1))
        await _until(lambda: len(facts(ledger)) == 2)
        append(path, rollout_line(2))
        await _until(lambda: len(facts(ledger)) == 3)
        sub = tmp_path / "sessions" / "claude" / "s1" / "subagents"  # a subagent transcript, deep and late
        sub.mkdir(parents=True)
        agent = sub / "agent-a1.jsonl"
        record = {"type": "user", "sessionId": "s1", "uuid": "u1", "timestamp": "2026-11-30T00:00:00Z",
                  "isSidechain": True, "message": {"role": "user", "content": "hi"}}
        append(agent, json.dumps(record).encode() + b"\n")
        await _until(lambda: any(e.envelope.source == f"file:{agent}" for e in ledger.read()))
        assert facts(ledger) == replayed(path) + replayed(agent)

    _watching(root, body)


def test_a_watched_directory_that_appears_after_start_is_followed_and_said_so_once(tmp_path, caplog):
    spool = tmp_path / "spool"  # watched beside it, and there from the start
    spool.mkdir()
    root = tmp_path / "home" / ".claude" / "projects"  # a fresh HOME: not even ~/.claude yet
    caplog.set_level(logging.WARNING, logger="tillerman.watch")

    async def body(ledger):
        await anyio.sleep(0.3)  # several looks find nothing
        root.mkdir(parents=True)
        path = root / rollout_name()
        append(path, session_meta() + rollout_line(1))  # written at once, before any watch is on it
        await _until(lambda: len(facts(ledger)) == 2)
        append(path, rollout_line(2))  # and followed as it grows
        await _until(lambda: len(facts(ledger)) == 3)
        shutil.rmtree(root)  # removed: waited for again
        await _until(lambda: "is gone" in caplog.text)
        root.mkdir()
        again = root / rollout_name("01a229c4-3717-7c10-9d2e-5b7f0c9e1a09")
        append(again, session_meta("01a229c4-3717-7c10-9d2e-5b7f0c9e1a09"))
        await _until(lambda: any(e.envelope.source == f"file:{again}" for e in ledger.read()))
        await _until(lambda: caplog.text.count("appeared") == 2)  # a rescan may have read it first

    _watching(spool, body, also=[root], appear_every=0.05)
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"watch: {root} does not exist yet: following it once it appears",
                    f"watch: {root} appeared: following it",
                    f"watch: {root} is gone: following it once it appears",
                    f"watch: {root} appeared: following it"]


def test_the_watcher_sees_deletion_and_rotation(tmp_path):
    root, path = _sessions_with_a_rollout(tmp_path)
    doomed = root / "doomed.jsonl"
    append(doomed, session_meta("01a229c4-3717-7c10-9d2e-5b7f0c9e1a09"))

    async def body(ledger):
        await _until(lambda: len(facts(ledger)) == 3)
        rotated = root / "rotated-1.jsonl"
        os.rename(path, rotated)
        append(rotated, rollout_line(2))
        doomed.unlink()
        await _until(lambda: [q.reason for q in quarantines(ledger)] == [FILE_DELETED]
                     and len(facts(ledger)) == 5, timeout=5)
        await anyio.sleep(0.3)
        assert [q.source for q in quarantines(ledger)] == [f"file:{doomed}"]  # the rotation is no deletion
        sources = [e.envelope.source for e in ledger.read()]
        assert sources.count(f"file:{path}") == 3  # the rotated file kept its source and went on

    _watching(root, body)


def test_a_watch_restarted_resumes_and_records_what_changed_meanwhile(tmp_path):
    root, path = _sessions_with_a_rollout(tmp_path)

    async def first(ledger):
        await _until(lambda: len(facts(ledger)) == 2)

    _watching(root, first)
    append(path, rollout_line(2))  # while nobody watches

    async def second(ledger):
        await _until(lambda: len(facts(ledger)) == 3)
        await anyio.sleep(0.2)
        assert facts(ledger) == replayed(path)

    _watching(root, second)


# -- the daemon -----------------------------------------------------------------------------


def _daemon(tmp_path, root, body):
    ledger_path = tmp_path / "ledger.sqlite3"

    async def run():
        with SQLiteRecorder(ledger_path) as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions(watch=(str(root),)))
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                with SQLiteRecorder(ledger_path) as reader:
                    await body(reader)
                tg.cancel_scope.cancel()

    anyio.run(run)
    return ledger_path


def test_run_with_only_watch_follows_files_without_an_app_server(tmp_path):
    root = tmp_path / "sessions"
    root.mkdir()
    fixture = SESSIONS / "codex-rollout" / "live-0.163-supervised.jsonl"
    target = root / fixture.name
    data = fixture.read_bytes()

    async def body(reader):
        for start in range(0, len(data), 3000):  # a session being written
            append(target, data[start:start + 3000])
            await anyio.sleep(0.01)
        expected = replayed(target)
        await _until(lambda: len(facts(reader)) == len(expected))
        assert facts(reader) == expected  # the daemon records what replay derives
        status = ledger_status(reader, tmp_path / "ledger.sqlite3", time.time())
        assert status["threads"] and not any(t["steerable"] for t in status["threads"])
        assert {r.offset for r in reader.file_offsets()} == {len(data)}

    _daemon(tmp_path, root, body)


def test_run_refuses_to_start_with_nothing_to_supervise():
    result = CliRunner().invoke(main, ["run", "--no-codex"])
    assert result.exit_code == 2 and "--watch DIR" in result.output


def test_run_watch_waits_for_a_missing_directory_in_the_daemon_and_status(tmp_path):
    root = tmp_path / "projects"

    async def body(reader):
        await _until(lambda: _daemon_status(reader, tmp_path)["watch_waiting"] == [str(root)])
        assert f"files: waiting for {root} to appear, then following it" in _status_lines(reader, tmp_path)
        root.mkdir()
        path = root / rollout_name()
        append(path, session_meta() + rollout_line(1))
        await _until(lambda: len(facts(reader)) == 2)
        assert facts(reader) == replayed(path)
        await _until(lambda: _daemon_status(reader, tmp_path)["watch_waiting"] == [])
        assert not any("waiting" in line for line in _status_lines(reader, tmp_path))

    _daemon(tmp_path, root, body)


def _daemon_status(reader, tmp_path) -> dict:
    return ledger_status(reader, tmp_path / "ledger.sqlite3", time.time())["daemon"]


def _status_lines(reader, tmp_path) -> list[str]:
    """What ``tillerman status`` prints of the daemon (running: this test holds no lock file)."""
    return _daemon_lines({**_daemon_status(reader, tmp_path), "running": True})


def _run_context(args):
    """``tillerman run ARGS`` parsed (its options' checks run), not started."""
    parent = main.make_context("tillerman", ["run"])
    return main.get_command(parent, "run").make_context("run", args, parent=parent)


def test_run_watch_accepts_a_missing_directory_and_refuses_one_that_can_never_be(tmp_path):
    missing = str(tmp_path / "not" / "yet")
    assert _run_context(["--no-codex", "--watch", missing]).params["watch_dirs"] == (missing,)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for watched, why in ((blocker / "projects", f"{blocker} is a file, in the way of {blocker / 'projects'}"),
                         (blocker, "is a file")):
        result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(watched)])
        assert result.exit_code == 2 and why in result.output, result.output


def test_latency_is_well_under_the_budget_for_a_trickle(tmp_path):
    """Not a benchmark (bench/bench_tail_latency.py is): a sanity bound on the tuned debounce."""
    root = tmp_path / "sessions"
    root.mkdir()
    path = root / rollout_name()
    append(path, session_meta())
    delays = []

    async def body(ledger):
        await _until(lambda: len(facts(ledger)) == 1)
        for i in range(20):
            sent = time.monotonic()
            append(path, rollout_line(i))
            await _until(lambda n=i: len(facts(ledger)) == n + 2)
            delays.append(time.monotonic() - sent)
        assert sorted(delays)[len(delays) // 2] < 0.5

    _watching(root, body)
