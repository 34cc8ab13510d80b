"""Thread ownership by lease, with fencing tokens, for several daemons on one PostgreSQL
ledger (``tillerman.ledger.postgres``).

A ``leases`` row per thread names its owner (one daemon), a fencing token and an
expiry. Acquiring a free or expired lease bumps the token (every acquisition, the same
owner's included); only the holder renews it, and only while it has not lapsed: a
lapsed lease is acquired again, under a new token. Times are the database server's
(``clock_timestamp()``), so the daemons' clocks do not matter.

The fence: a dispatch record is appended only if the caller's token is still current,
checked inside the append's transaction with ``FOR SHARE`` (``PostgresRecorder.append(…,
fence=lease)``). The shared lock makes a takeover's update of the row wait until that
transaction ends, and a check that waits on a takeover's update re-reads the new row
and fails: without it, a stale holder's append could commit after a takeover. A daemon
whose lease lapsed (paused, partitioned, slow) gets ``Fenced`` and writes nothing.

What the fence does not cover: the write to the app-server's socket happens after the
dispatch record commits. ``still_held`` re-checks just before it; a daemon stopped
between that check and the write (SIGSTOP, a long GC pause) can still send once after
its lease lapsed. The next owner reconciles every non-terminal intent by readback
before it dispatches, so it never sends the same intent a second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import msgspec
import psycopg

from tillerman.ledger.errors import Fenced

SCHEMA = (
    """CREATE TABLE leases (
        thread_id BYTEA PRIMARY KEY,
        owner TEXT NOT NULL,
        token BIGINT NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    )""",
    "CREATE INDEX leases_owner ON leases (owner)",
)
#: Every daemon sharing the database, and when it last renewed (``tillerman status``);
#: created by any writer that opens a ledger made before it.
DAEMONS = (
    """CREATE TABLE IF NOT EXISTS daemons (
        owner TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NOT NULL,
        lease_seconds DOUBLE PRECISION NOT NULL
    )"""
)

#: The fence, run inside an append's transaction.
FENCE = ("SELECT 1 FROM leases WHERE thread_id = %s AND owner = %s AND token = %s"
         " AND expires_at > clock_timestamp() FOR SHARE")


class Lease(msgspec.Struct, frozen=True):
    thread_id: str
    owner: str
    token: int
    expires_at: float  # the server's clock, seconds since the epoch


Transaction = Callable[[], contextlib.AbstractContextManager[psycopg.Connection]]


def _key(thread_id: str) -> bytes:
    return thread_id.encode("utf-8", "surrogatepass")


class Leases:
    """The lease table of one ledger database (``PostgresRecorder.leases``)."""

    def __init__(self, transaction: Transaction, statement: Transaction) -> None:
        self._transaction = transaction
        self._statement = statement  # one statement, autocommitted: one round trip

    def acquire(self, thread_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the thread if no one holds it or its lease expired, under a new token;
        None while another owner's lease (or the caller's own, unexpired) stands."""
        with self._transaction() as conn:
            row = conn.execute(
                "INSERT INTO leases (thread_id, owner, token, acquired_at, expires_at)"
                " VALUES (%s, %s, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => %s))"
                " ON CONFLICT (thread_id) DO UPDATE SET owner = excluded.owner, token = leases.token + 1,"
                " acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
                " WHERE leases.expires_at <= clock_timestamp()"
                " RETURNING token, extract(epoch FROM expires_at)::float8",
                (_key(thread_id), owner, ttl)).fetchone()
        return None if row is None else Lease(thread_id, owner, row[0], row[1])

    def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend a lease that is still current; None when it lapsed or was taken."""
        with self._transaction() as conn:
            row = conn.execute(
                "UPDATE leases SET expires_at = clock_timestamp() + make_interval(secs => %s)"
                " WHERE thread_id = %s AND owner = %s AND token = %s AND expires_at > clock_timestamp()"
                " RETURNING extract(epoch FROM expires_at)::float8",
                (ttl, _key(lease.thread_id), lease.owner, lease.token)).fetchone()
        return None if row is None else msgspec.structs.replace(lease, expires_at=row[0])

    def release(self, lease: Lease) -> None:
        """Give the thread up at once (a clean shutdown), if still held under this token."""
        with self._transaction() as conn:
            conn.execute("UPDATE leases SET expires_at = clock_timestamp()"
                         " WHERE thread_id = %s AND owner = %s AND token = %s",
                         (_key(lease.thread_id), lease.owner, lease.token))

    def still_held(self, lease: Lease) -> bool:
        """The re-check just before the socket write (see the module's doc for the window left)."""
        with self._statement() as conn:
            return conn.execute(FENCE.replace(" FOR SHARE", ""), fence_params(lease)).fetchone() is not None

    def beat(self, owner: str, host: str, pid: int, ttl: float) -> None:
        """The daemon ``owner`` is alive and renewing (its row in ``daemons``)."""
        with self._statement() as conn:
            conn.execute("INSERT INTO daemons (owner, host, pid, started_at, renewed_at, lease_seconds)"
                         " VALUES (%s, %s, %s, clock_timestamp(), clock_timestamp(), %s)"
                         " ON CONFLICT (owner) DO UPDATE SET renewed_at = excluded.renewed_at,"
                         " lease_seconds = excluded.lease_seconds", (owner, host, pid, ttl))

    def leave(self, owner: str) -> None:
        """A clean shutdown: the daemon's row goes, and every lease it holds is free at once."""
        with self._transaction() as conn:
            conn.execute("UPDATE leases SET expires_at = clock_timestamp()"
                         " WHERE owner = %s AND expires_at > clock_timestamp()", (owner,))
            conn.execute("DELETE FROM daemons WHERE owner = %s", (owner,))

    def daemons(self) -> list[dict]:
        """Every daemon that registered: id, host, pid, start and last renewal (server
        time), and whether it renewed within its lease length (``alive``)."""
        with self._statement() as conn:
            rows = conn.execute(
                "SELECT owner, host, pid, extract(epoch FROM started_at)::float8,"
                " extract(epoch FROM renewed_at)::float8, lease_seconds,"
                " renewed_at + make_interval(secs => lease_seconds) > clock_timestamp()"
                " FROM daemons ORDER BY owner").fetchall()
        return [{"id": o, "host": h, "pid": p, "since": s, "renewed_at": r, "lease_seconds": t, "alive": a}
                for o, h, p, s, r, t, a in rows]

    def all(self) -> list[dict]:
        """Every lease: thread, owner, token, expiry (server time), and whether it stands."""
        with self._statement() as conn:
            rows = conn.execute(
                "SELECT thread_id, owner, token, extract(epoch FROM expires_at)::float8,"
                " expires_at > clock_timestamp() FROM leases ORDER BY owner, thread_id").fetchall()
        return [{"thread": bytes(t).decode("utf-8", "surrogatepass"), "owner": o, "token": k, "expires_at": e,
                 "held": h} for t, o, k, e, h in rows]


def fence_params(lease: Lease) -> tuple:
    return (_key(lease.thread_id), lease.owner, lease.token)


def check_fence(conn: psycopg.Connection, lease: Lease) -> None:
    """Inside the caller's transaction: raise ``Fenced`` unless ``lease`` is current,
    and hold a shared lock on its row until the transaction ends."""
    if conn.execute(FENCE, fence_params(lease)).fetchone() is None:
        raise Fenced(f"the lease on thread {lease.thread_id} (token {lease.token}, owner {lease.owner}) is no longer"
                     " current: nothing was written; reconcile instead of dispatching")

