"""``tillerman run -v`` logs what tillerman did with a followed file (which file, thread
and turn), not its file watcher's "N changes detected"."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tillerman.ledger.events import TurnCompleted
from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPT = ROOT / "fixtures" / "sessions" / "claude-live" / "priority-now" / "transcript.jsonl"


def test_verbose_run_names_file_thread_and_turn_and_not_the_watchers_changes(tmp_path: Path) -> None:
    watched = tmp_path / "projects"
    watched.mkdir()
    ledger = tmp_path / "ledger.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tillerman.controller.cli.main import main; main()", "run", "--no-codex",
         "--watch", str(watched), "--ledger", str(ledger), "-v"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        target = watched / "session.jsonl"
        lines = TRANSCRIPT.read_text().splitlines(keepends=True)
        target.write_text(lines[0])
        _until(lambda: _read(ledger) >= 1)  # the daemon is up and follows the file
        for line in lines[1:]:  # then the file grows under the watcher's eyes
            with target.open("a") as out:
                out.write(line)
            time.sleep(0.02)
        _until(lambda: _turns_ended(ledger) >= 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=20)
    assert "change detected" not in log and "changes detected" not in log
    assert f"{target}: following it as claude-transcript" in log
    session = TRANSCRIPT.read_text().split('"sessionId":"', 1)[1].split('"', 1)[0]
    assert f"{target}: thread {session}: turn " in log
    assert " interrupted" in log and " completed" in log, log
    shutil.rmtree(watched)


def _until(done, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _read(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    with SQLiteRecorder(ledger) as rec:
        return sum(1 for entry in rec.read() if entry.envelope.offset is not None)


def _turns_ended(ledger: Path) -> int:
    if not ledger.exists():
        return 0
    with SQLiteRecorder(ledger) as rec:
        return sum(1 for entry in rec.read() if isinstance(entry.envelope.event, TurnCompleted))
