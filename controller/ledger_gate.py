"""The daemon's recorder while a decision round commits on a worker thread.

A round's commit is I/O: the WAL write, now and then a checkpoint with its flushes. On
a busy disk it took 1–70 ms (p90 11 ms at 200 threads), and on the event loop nothing
was read off the socket meanwhile. The brain now hands the end of its transaction to a
worker thread and the loop goes on reading. Everything else that uses the ledger —
a delivery recording its dispatch, the rule watcher, a review, the notifier's sinks —
goes through this gate: it waits until the round's commit is done, then runs. So the
ledger's order is the order things happened in, and a delivery's durable dispatch
record still commits after the round that decided it and before its request is sent.

The gate is closed on the loop and the commit handed to the thread in the same step,
with no await between them (anyio's ``to_thread`` yields to the loop before it hands
the job over: a task stopped at the gate then would wait for a job never handed over);
the thread opens the gate when the commit ends, won or lost. The brain runs no ledger
code while its commit is out."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class GatedRecorder:
    """Any recorder, each of its methods run only while no round is committing."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder
        self._committing = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tillerman-commit")

    def commit_off_loop(self, finish: Callable[[], None]) -> Future:
        """Close the gate and hand ``finish`` to the commit thread, which opens the gate
        once it has run; the future says how it went."""
        self._committing.acquire()

        def run() -> None:
            try:
                finish()
            finally:
                self._committing.release()

        try:
            return self._writer.submit(run)
        except BaseException:
            self._committing.release()
            raise

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._recorder, name)
        if not callable(value):
            return value

        def gated(*args: Any, **kwargs: Any) -> Any:
            with self._committing:
                return value(*args, **kwargs)

        return gated
