"""``tillerman replay --ledger`` into a new ledger, SIGKILLed while its writer process
(``tillerman.ledger.load``) is loading rows: the writer commits the whole batches it
was sent and exits; the ledger verifies, holds a prefix of the chain, and a replay into
a new ledger afterwards writes the same rows from the start."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from bench.sessions import rollout_name, write_rollout
from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has exited: nothing of it runs


def _rows(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("SELECT count(*) FROM events").fetchone()[0]
    except sqlite3.Error:
        return 0  # not created yet


def _replay(session: Path, ledger: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "tillerman", "replay", "--jobs", "2", "--json", "--ledger",
                             str(ledger), str(session)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_replay_killed_mid_load_leaves_a_verified_prefix(tmp_path):
    session = tmp_path / rollout_name(5)
    write_rollout(str(session), 150_000, seed=5)  # about 100 MB: seconds of loading
    ledger = tmp_path / "killed.sqlite3"
    proc = _replay(session, ledger)
    deadline = time.monotonic() + 120
    while _rows(ledger) == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the replay ended before it could be killed: {proc.stderr.read().decode()[-300:]}"
    children = _children(proc.pid)  # the writer, and the forked reader
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while not all(_gone(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in children), "a child of the killed replay is still running"

    with SQLiteRecorder(ledger) as killed:
        report = killed.verify()
        assert report.ok, report.problems
        kept = killed.max_seq()
        assert kept > 0
        prefix = [(e.seq, e.envelope.event_id, e.hash) for e in killed.read()]

    whole = tmp_path / "whole.sqlite3"
    again = _replay(session, whole)
    assert again.wait(timeout=300) == 0, again.stderr.read().decode()[-300:]
    with SQLiteRecorder(whole) as complete:
        assert complete.max_seq() > kept  # killed before the end
        assert [(e.seq, e.envelope.event_id, e.hash) for e in complete.read(limit=kept)] == prefix
