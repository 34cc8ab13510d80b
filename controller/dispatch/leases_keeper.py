"""One daemon's thread leases, when several daemons share one PostgreSQL ledger
(``tillerman.ledger.leases``).

A daemon supervises — decides and dispatches for — only the threads it holds a lease
on. Every ``renew_every`` (a third of the lease length) the keeper records that the
daemon is alive, renews what it holds while the daemon is healthy, and takes every
thread it sees whose lease is free or expired (each acquisition bumps the thread's
fencing token). A lease that could not be renewed is lost at once: its thread's
deliveries stop here. A thread just taken is *held* but not yet *ready*: the daemon
reads it back and reconciles its deliveries under way first (``Daemon._take_over``),
then marks it ready, and only then decides for it.

A SQLite ledger has no keeper: its one daemon owns every thread.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # psycopg is imported only for a database ledger
    from tillerman.ledger.leases import Lease, Leases

DEFAULT_LEASE = 15.0  # seconds: `tillerman run --lease` on a database ledger
RENEWALS_PER_LEASE = 3  # renew three times per lease length: two renewals may fail or run late


def daemon_id() -> str:
    """This daemon's name in the lease table: its host, its pid and a random part (a pid is
    reused; the random part tells two lives of one pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Fence:
    """What a delivery carries for its thread: the lease its dispatch record is fenced
    with (``Recorder.append(…, fence=lease)``) and the re-check just before the send."""
    lease: Lease
    leases: Leases

    def still_held(self) -> bool:
        return self.leases.still_held(self.lease)


@dataclass
class Tick:
    lost: list[str] = field(default_factory=list)  # leases that lapsed or were taken: stop delivering
    gained: list[str] = field(default_factory=list)  # taken now: reconcile before deciding


class LeaseKeeper:
    def __init__(self, leases: Leases, ttl: float, owner: str | None = None) -> None:
        self.leases = leases
        self.ttl = ttl
        self.renew_every = ttl / RENEWALS_PER_LEASE
        self.owner = owner or daemon_id()
        self._held: dict[str, Lease] = {}
        self._ready: set[str] = set()
        # When the last round that renewed began (monotonic): every lease it renewed
        # expires no sooner than ``ttl`` after it, and surely did once that is past.
        self._renewed_at = time.monotonic()

    def holds(self, thread_id: str) -> bool:
        return thread_id in self._held

    def ready(self, thread_id: str) -> bool:
        """Held, and read back since it was taken: the daemon may decide for it."""
        return thread_id in self._ready

    def fence(self, thread_id: str) -> Fence | None:
        lease = self._held.get(thread_id)
        return None if lease is None else Fence(lease, self.leases)

    def reconciled(self, thread_ids: Iterable[str]) -> None:
        self._ready.update(t for t in thread_ids if t in self._held)

    def lost(self, thread_id: str) -> None:
        """The lease is no longer current (a failed renewal, or a fenced dispatch)."""
        self._held.pop(thread_id, None)
        self._ready.discard(thread_id)

    def tick(self, candidates: Iterable[str], *, healthy: bool) -> Tick:
        """One renewal round. ``healthy``: the daemon can deliver (attached to its
        app-server, or it has none); an unhealthy daemon renews nothing and takes
        nothing, so its leases lapse and another daemon takes the threads."""
        tick = Tick()
        if not healthy:
            return tick
        started = time.monotonic()
        self.leases.beat(self.owner, socket.gethostname(), os.getpid(), self.ttl)
        for thread_id, lease in list(self._held.items()):
            if (renewed := self.leases.renew(lease, self.ttl)) is None:
                self.lost(thread_id)
                tick.lost.append(thread_id)
            else:
                self._held[thread_id] = renewed
        wanted = set(candidates) - self._held.keys()
        if wanted:
            standing = {row["thread"] for row in self.leases.all() if row["held"]}
            for thread_id in sorted(wanted - standing):
                if (lease := self.leases.acquire(thread_id, self.owner, self.ttl)) is not None:
                    self._held[thread_id] = lease
                    tick.gained.append(thread_id)
        self._renewed_at = started
        return tick

    def lapsed(self, now: float | None = None) -> list[str]:
        """After a round that could not reach the ledger: the leases no renewal can have
        kept past now (the last successful round began more than ``ttl`` ago), given up
        here. Their threads are decided for again only once taken anew and read back —
        the fence would refuse their dispatches anyway; this stops the deciding too."""
        if (time.monotonic() if now is None else now) - self._renewed_at < self.ttl:
            return []
        gone = sorted(self._held)
        for thread_id in gone:
            self.lost(thread_id)
        return gone

    def leave(self) -> None:
        """A clean stop: every lease is given up at once, for the others to take."""
        self.leases.leave(self.owner)
        self._held.clear()
        self._ready.clear()
