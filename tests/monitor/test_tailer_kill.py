"""SIGKILL ``tillerman run --watch`` at random moments while session files are being
appended (lines written in two pieces, so kills land mid-line too); after a final
restart the ledger holds every line exactly once, checked line by line."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.monitor.tailer_support import rollout_line, rollout_name, session_meta
from tillerman.ledger import events as ev
from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]
FILES = 3
LINES = 400  # per file
KILLS = 5


def _start(root: Path, ledger: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from tillerman.controller.cli.main import main; main()", "run", "--no-codex",
         "--watch", str(root), "--ledger", str(ledger)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _max_seq(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    with SQLiteRecorder(ledger) as rec:
        return rec.max_seq()


def _until_reading(ledger: Path, before: int, writer_done: threading.Event, timeout: float = 15.0) -> None:
    """Until the started daemon has recorded something new (on a loaded machine its start
    alone can outlast a random kill delay, and a kill then lands on no reading at all);
    once the writer is done there may be nothing new to record: then a short grace."""
    deadline = time.monotonic() + (1.0 if writer_done.is_set() else timeout)
    while _max_seq(ledger) <= before and time.monotonic() < deadline:
        time.sleep(0.02)


def _writer(paths: list[Path], lines: dict[Path, list[bytes]], rng: random.Random, done: threading.Event) -> None:
    for i in range(LINES):
        for path in paths:
            line = rollout_line(i)
            cut = rng.randint(1, len(line) - 1)
            with open(path, "ab") as fh:
                fh.write(line[:cut])
                fh.flush()
                if rng.random() < 0.3:
                    time.sleep(0.001)  # a writer caught mid-line
                fh.write(line[cut:])
            lines[path].append(line)
        time.sleep(rng.uniform(0, 0.008))
    done.set()


def test_sigkill_at_random_moments_loses_and_repeats_no_line(tmp_path):
    rng = random.Random(int(os.environ.get("TILLERMAN_KILL_SEED", "4")))
    root = tmp_path / "sessions"
    root.mkdir()
    ledger = tmp_path / "ledger.sqlite3"
    paths = [root / rollout_name(f"01a229c4-3717-7c10-9d2e-5b7f0c9e1a0{n}") for n in range(FILES)]
    lines: dict[Path, list[bytes]] = {}
    for n, path in enumerate(paths):
        meta = session_meta(f"01a229c4-3717-7c10-9d2e-5b7f0c9e1a0{n}")
        path.write_bytes(meta)
        lines[path] = [meta]
    done = threading.Event()
    writer = threading.Thread(target=_writer, args=(paths, lines, rng, done))
    writer.start()
    kills, progress = 0, []
    try:
        while not done.is_set() or kills < KILLS:
            proc = _start(root, ledger)
            _until_reading(ledger, progress[-1] if progress else 0, done)  # not killed while still importing
            time.sleep(rng.uniform(0.0, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            if ledger.exists():
                with SQLiteRecorder(ledger) as rec:
                    progress.append(rec.max_seq())
    finally:
        writer.join()
    # the kills landed while lines were being read, not only before or after
    assert len(set(progress)) >= 3, progress
    final = _start(root, ledger)
    try:
        expected = sum(len(v) for v in lines.values())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with SQLiteRecorder(ledger) as rec:
                if sum(1 for e in rec.read() if e.envelope.offset is not None) >= expected:
                    break
            time.sleep(0.1)
    finally:
        final.send_signal(signal.SIGTERM)
        _, err = final.communicate(timeout=15)
    assert b"Traceback" not in err, err.decode()
    with SQLiteRecorder(ledger) as rec:
        assert rec.verify().ok
        seen: dict[str, list[tuple[int, int]]] = {}
        for entry in rec.read():
            env = entry.envelope
            assert not isinstance(env.event, ev.Quarantined | ev.Conflict), env
            if env.offset is not None:
                seen.setdefault(env.source, []).append((env.offset, env.length))
        rows = {r.path: r for r in rec.file_offsets()}
    assert kills >= KILLS
    for path in paths:
        offsets, at = [], 0
        for line in lines[path]:  # every line, in order, exactly once, with its byte range
            offsets.append((at, len(line)))
            at += len(line)
        assert seen[f"file:{path}"] == offsets, path
        assert rows[str(path)].offset == path.stat().st_size
