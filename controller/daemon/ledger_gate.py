"""The daemon's recorder while a decision round commits on a worker thread.

A round's commit is I/O: the WAL write, now and then a checkpoint with its flushes. On
a busy disk it took 1–70 ms (p90 11 ms at 200 threads), and on the event loop nothing
was read off the socket meanwhile. The brain now hands the end of its transaction to a
worker thread and the loop goes on reading. Everything else that uses the ledger —
a delivery recording its dispatch, the rule watcher, a review, the notifier's sinks —
goes through this gate: it waits until the round's commit is done, then runs. So the
ledger's order is the order things happened in, and a delivery's durable dispatch
record still commits after the round that decided it and before its request is sent.

A delivery's own records (its durable dispatch record: a commit and a flush, up to
10 ms on this disk) are written on that thread too (``append_off_loop``): on the loop
they stopped the reading of every other thread's notifications while the disk
flushed. The delivery waits for its record as before (nothing is sent before it is
written); the loop does not. The round and such a write take turns (``turns``): a
round uses the connection on the loop until its commit is done, a write on the
thread, and never both at once.

The gate is closed on the loop and the commit handed to the thread in the same step,
with no await between them (anyio's ``to_thread`` yields to the loop before it hands
the job over: a task stopped at the gate then would wait for a job never handed over);
the thread opens the gate when the commit ends, won or lost. The brain runs no ledger
code while its commit is out."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio


class GatedRecorder:
    """Any recorder, each of its methods run only while no round is committing."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self._committing = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tillerman-commit")
        # Who uses the connection now, a round (on the loop, until its commit is done) or
        # a write handed to the thread: one at a time, in the order they asked.
        self.turns = anyio.Lock(fast_acquire=True)

    def commit_off_loop(self, finish: Callable[[], Any]) -> Future:
        """Close the gate and hand ``finish`` to the commit thread, which opens the gate
        once it has run; the future holds what it returned or raised."""
        self._committing.acquire()

        def run() -> Any:
            try:
                return finish()
            finally:
                self._committing.release()

        try:
            return self._writer.submit(run)
        except BaseException:
            self._committing.release()
            raise

    async def append_off_loop(self, *args: Any, **kwargs: Any) -> Any:
        """``append`` on the commit thread, in turn with the rounds; the caller waits for
        it (shielded: a write handed over always ends before the next turn begins)."""
        async with self.turns:
            written = asyncio.wrap_future(self.commit_off_loop(lambda: self._recorder.append(*args, **kwargs)))
            with anyio.CancelScope(shield=True):
                return await written

    def leases(self) -> Any:
        """The recorder's thread leases (``Recorder.leases``), each call run only while no
        round is committing: the lease keeper renews on the loop while a round's commit
        may be out, and the round's transaction is the recorder's until that commit ends."""
        leases = self._recorder.leases()
        return None if leases is None else _Gated(leases, self._committing)

    def __getattr__(self, name: str) -> Any:
        return _gated(getattr(self._recorder, name), self._committing)


class _Gated:
    """Any object, each of its methods run only while the gate is open."""

    def __init__(self, target: Any, gate: threading.Lock) -> None:
        self._target, self._gate = target, gate

    def __getattr__(self, name: str) -> Any:
        return _gated(getattr(self._target, name), self._gate)


def _gated(value: Any, gate: threading.Lock) -> Any:
    if not callable(value):
        return value

    def gated(*args: Any, **kwargs: Any) -> Any:
        with gate:
            return value(*args, **kwargs)

    return gated
