"""The change feed: a process that follows a ledger (the daemon, ``tillerman claude``)
learns that another process committed to it (``tillerman intent propose``, a delivery
recording an answer) as it happens, without polling the ledger.

One interface, ``ChangeFeed``, from ``Recorder.change_feed``; each backend says how it
knows:

* SQLite (``WalWatcher``): every commit appends to the ``-wal`` file beside the ledger,
  and the kernel tells of the write (inotify, through ``watchfiles``). An idle watcher
  costs almost nothing.
* PostgreSQL (``ListenerFeed`` over ``tillerman.ledger.postgres.ChangeListener``): every
  commit sends a NOTIFY, and a connection of the feed's own LISTENs.
* A ledger no other process can write (in memory) has no feed.

``anyio`` and ``watchfiles`` are imported when a feed is followed, not with this module:
a command that only reads or writes the ledger pays nothing for them.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol

from tillerman.ledger.paths import ledger_files

STEP_MS = 30  # a feed checks for commits (and for being stopped) this often
#: How long a cancelled ``watchfiles`` watch may take to notice (its Rust side wakes this often).
RUST_TIMEOUT_MS = 1000
#: One wait of a listener on its worker thread: stopping the follower waits for at most one.
LISTEN_SLICE = STEP_MS / 1000 * 10


class ChangeFeed(abc.ABC):
    """Commits to one ledger, by any process: ``async for seq in feed`` goes round once
    after each (commits close together may be one round), with the last seq committed
    where the backend tells it (PostgreSQL) and None where it does not (SQLite), until
    the task is cancelled. A feed that can no longer tell (its database connection lost)
    raises ``OperationalError``; a new one from ``Recorder.change_feed`` follows again,
    and what was committed meanwhile must be read, unannounced."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[int | None]: ...

    def close(self) -> None:
        """Let go of what the feed holds (a connection); by default there is nothing."""
        return None


class WalWatcher(ChangeFeed):
    """A SQLite ledger's commits, as writes to its ``-wal`` file (watched in its folder:
    the file comes and goes with checkpoints)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)

    async def __aiter__(self) -> AsyncIterator[int | None]:
        import watchfiles

        wal = ledger_files(self._path).wal
        async for _ in watchfiles.awatch(self._path.parent, watch_filter=lambda change, name: name == wal,
                                         debounce=2 * STEP_MS, step=STEP_MS, rust_timeout=RUST_TIMEOUT_MS,
                                         yield_on_timeout=False, recursive=False):
            yield None


class Listener(Protocol):
    """A blocking listener for commits (``tillerman.ledger.postgres.ChangeListener``)."""

    def wait(self, timeout: float) -> int | None:
        """The last seq committed since the previous call, waiting up to ``timeout``
        seconds for one; None when nothing was."""

    def close(self) -> None: ...


class ListenerFeed(ChangeFeed):
    """A blocking ``Listener`` followed from async code: each wait runs on a worker
    thread, in ``LISTEN_SLICE`` slices so that a cancelled follower does not wait long."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener

    async def __aiter__(self) -> AsyncIterator[int | None]:
        import anyio

        wait: Callable[[float], int | None] = self._listener.wait
        while True:
            if (seq := await anyio.to_thread.run_sync(wait, LISTEN_SLICE)) is not None:
                yield seq

    def close(self) -> None:
        self._listener.close()
