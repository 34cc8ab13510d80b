"""The daemon's garbage collector, kept from pausing the loop for long.

CPython's full collection walks every tracked object. The daemon keeps what it folds
(a projection of every thread and intent), so a full pass grew with the ledger: at
200 busy threads, passes of 30–45 ms, during which nothing was read off the socket
and notifications queued behind them (a cause of the notification → decision p99).
What lives that long is never garbage, and the daemon makes almost no cyclic garbage
(measured: none reached the old generation in a 200-thread run), so what has survived
is frozen out of the collector's sight (``gc.freeze``) at every heartbeat, after the
young generations are collected so that no young garbage is frozen with it. A full
pass then walks only what survived since the last heartbeat.

Cyclic garbage that reached the old generation before a freeze would be kept: once an
hour the frozen objects are handed back and collected once, whole (one pause an hour
instead of one every few seconds).
"""

from __future__ import annotations

import gc

FULL_EVERY = 3600.0  # seconds between two full collections of everything


class Collector:
    def __init__(self, now: float) -> None:
        self._full_at = now

    def start(self, now: float) -> None:
        """After the ledger is folded at a start: collect once, whole, and freeze."""
        gc.collect()
        gc.freeze()
        self._full_at = now

    def settle(self, now: float) -> None:
        """At a heartbeat: freeze what survived (once an hour, collect everything first)."""
        if now - self._full_at >= FULL_EVERY:
            gc.unfreeze()
            gc.collect()
            self._full_at = now
        else:
            gc.collect(1)
        gc.freeze()
