import multiprocessing
import os

import pytest

from tillerman.ledger.errors import LedgerLocked
from tillerman.ledger.lock import LedgerLock


def _hold(path, ready, done):
    with LedgerLock(path):
        ready.set()
        done.wait(30)


def _start_holder(path):
    """Another process that takes the lock and holds it until ``done`` is set (or it is killed)."""
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, ready, done))
    holder.start()
    return holder, ready, done


def test_a_second_daemon_is_refused_and_told_who_holds_it(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    holder, ready, done = _start_holder(path)
    try:
        assert ready.wait(30)
        with pytest.raises(LedgerLocked, match=f"pid {holder.pid}"):
            LedgerLock(path).acquire()
    finally:
        done.set()
        holder.join(30)
    with LedgerLock(path):  # released when the holder exits
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    holder, ready, _ = _start_holder(path)
    assert ready.wait(30)
    holder.kill()
    holder.join(30)
    with LedgerLock(path):
        assert (tmp_path / "ledger.sqlite3.lock").read_text() == str(os.getpid())
