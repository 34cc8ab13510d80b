"""Another process sees each commit of a writer that keeps its connection open (as the
daemon does), while that writer is still running.

The head anchor is written under a lock. Taking that lock on a descriptor of the
database file itself, and closing it, silently dropped SQLite's own POSIX locks in the
writer's process (closing any descriptor of a file drops them all); from then on other
processes saw none of its commits until it exited.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
import sys, time
from tillerman.controller.core import intent_requests
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder

recorder = SQLiteRecorder(sys.argv[1])
intent = intent_requests.propose(recorder, thread_id="T1", mode="queue", text="later", owner="ann")
print(intent.id, flush=True)
sys.stdin.readline()
intent_requests.transition(recorder, intent.id, State.DISPATCH_UNKNOWN, "dispatching", {"attempt": "a", "mode": "queue"},
                   durable=True)
print("moved", flush=True)
sys.stdin.readline()  # stays open, like a daemon, until told to go
"""


def test_a_reader_sees_a_running_writers_commits(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ledger)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        writer.stdout.readline()
        with SQLiteRecorder(ledger) as reader:  # a reader that has seen the first commit
            assert reader.max_seq() == 1
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "moved"
        deadline = time.monotonic() + 5
        while True:
            with SQLiteRecorder(ledger) as reader:
                if reader.max_seq() == 2:
                    break
            assert time.monotonic() < deadline, "the writer's second commit never became visible"
            time.sleep(0.05)
    finally:
        writer.stdin.close()
        writer.wait(10)
