"""A replay stopped and continued again and again, as a shell stops its job at Ctrl-Z and
continues it at ``fg`` (a debugger or a profiler attaching does the same): the messages
between its processes — the forked reader's batches, the rows for the writer of a new
ledger — must arrive whole. A signal arriving while an unbuffered pipe write waits for
room cuts the write short; unwritten, the rest of the message was lost and the next read
began inside it (the replay failed on a decode error, or worse, decoded garbage)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.sessions import rollout_name, write_rollout
from tillerman.controller.replay.replayer import LOAD_BYTES
from tillerman.ledger.frames import receive, send
from tillerman.ledger.sqlite import SQLiteRecorder

ROOT = Path(__file__).resolve().parents[2]


class _ShortWrites:
    """A raw pipe end whose every write takes at most ``most`` bytes, as ``write(2)`` does
    when a signal interrupts it."""

    def __init__(self, most: int) -> None:
        self.most, self.written = most, bytearray()

    def write(self, data) -> int:
        taken = bytes(data[:self.most])
        self.written += taken
        return len(taken)


def test_a_message_is_written_whole_through_short_writes():
    pipe = _ShortWrites(most=7)
    send(pipe, b"x" * 100)
    send(pipe, b"second")
    assert bytes(pipe.written) == (100).to_bytes(8, "little") + b"x" * 100 + (6).to_bytes(8, "little") + b"second"


def test_a_message_whose_write_a_stop_interrupts_arrives_whole():
    """The write blocks (the message is four times the pipe's buffer and nobody reads);
    a stop and a continue interrupt it: ``write(2)`` returns what it wrote so far."""
    body = os.urandom(4 << 20)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        status = 1
        try:
            os.close(read_fd)
            with open(write_fd, "wb", buffering=0) as pipe:
                send(pipe, body)
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    time.sleep(0.2)  # the writer fills the pipe and waits for room
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.05)
    os.kill(pid, signal.SIGCONT)
    with open(read_fd, "rb") as pipe:
        got = receive(pipe)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == body


def _replay(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "tillerman", "replay", "--jobs", "2", "--json", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _stop_and_continue(proc: subprocess.Popen) -> int:
    """Stop the replay's process group and continue it every few milliseconds until it
    ends; how many times it was stopped."""
    stops = 0
    while proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGSTOP)
            time.sleep(0.003)
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            break
        stops += 1
        time.sleep(0.002)
    return stops


def _finished(proc: subprocess.Popen, stopped: bool) -> dict:
    stops = [0]
    if stopped:
        stopper = threading.Thread(target=lambda: stops.__setitem__(0, _stop_and_continue(proc)))
        stopper.start()
    out, err = proc.communicate(timeout=300)
    if stopped:
        stopper.join()
        assert stops[0] > 20, "the replay ended before it was stopped often enough to tell"
    assert proc.returncode == 0, err.decode()[-500:]
    return json.loads(out)


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("stopped") / rollout_name(7)
    write_rollout(str(path), 100_000, seed=7)  # about 70 MB: the reader runs ahead, its pipe fills
    assert path.stat().st_size > LOAD_BYTES
    return path


def test_a_replay_in_memory_stopped_and_continued_decides_as_one_left_alone(session):
    alone = _finished(_replay(str(session)), stopped=False)
    stopped = _finished(_replay(str(session)), stopped=True)
    assert (stopped["events"], stopped["decisions_digest"]) == (alone["events"], alone["decisions_digest"])


def test_a_replay_into_a_new_ledger_stopped_and_continued_writes_the_same_rows(session, tmp_path):
    rows = {}
    for stopped in (False, True):
        ledger = tmp_path / f"stopped-{stopped}.sqlite3"
        result = _finished(_replay("--ledger", str(ledger), str(session)), stopped=stopped)
        with SQLiteRecorder(ledger) as rec:
            report = rec.verify()
            assert report.ok, report.problems
            rows[stopped] = (result["decisions_digest"], [(e.seq, e.envelope.event_id, e.hash) for e in rec.read()])
    assert rows[True] == rows[False]
