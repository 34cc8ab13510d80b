"""A SQLite ledger's write-ahead log copied into its database file on a thread of its
own, so that no commit waits for it.

SQLite checkpoints by itself inside the commit that takes the log past 1000 pages:
that commit copies the log into the database and syncs both files before it returns.
For the daemon that commit is a decision round's, and the round's actions wait for it:
at 200 busy threads (about a checkpoint every few seconds) such commits took 10–25 ms
where the others took 0.4, and notifications queued behind them (the tail of the
notification → decision latency). The daemon's connection therefore stops
checkpointing (``wal_autocheckpoint = 0``) and this thread, on a connection of its own,
runs a ``PASSIVE`` checkpoint at most every ``every`` seconds, once a commit of that
connection tells it the log grew (``committed``): it copies what no reader still needs
while writers go on committing to the log, and takes no write lock. An idle daemon's
thread sleeps until the next commit: no wake-up costs it anything.

A checkpoint that fails (a full disk) leaves the log as it is, longer, and every row
in it committed; the next one tries again, and the reason is kept (``error``) until
one succeeds.
"""

from __future__ import annotations

import sqlite3
import threading

CHECKPOINT_EVERY = 0.5  # seconds between two checkpoints: the log stays at a second of writes or so


class BackgroundCheckpoints:
    def __init__(self, path: str, *, every: float | None = None, busy_timeout_ms: int = 5000) -> None:
        every = CHECKPOINT_EVERY if every is None else every
        self.error: str | None = None
        self.done = 0  # checkpoints run, for tests and for the curious
        self._stop = threading.Event()
        self._grown = threading.Event()  # a commit since the last checkpoint
        self._thread = threading.Thread(target=self._run, args=(path, every, busy_timeout_ms),
                                        name="tillerman-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A commit added to the log: checkpoint within ``every`` seconds."""
        self._grown.set()

    def stop(self) -> None:
        """Stop after the checkpoint under way, if one is."""
        self._stop.set()
        self._grown.set()
        self._thread.join()

    def _run(self, path: str, every: float, busy_timeout_ms: int) -> None:
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            self.error = f"cannot open {path} to checkpoint it: {exc}"
            return
        try:
            db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            # ``stop`` may set both events just before the ``clear`` below takes the wake-up
            # away: the loop looks at ``_stop`` before it waits again (waiting on ``_grown``
            # alone, a closing ledger's join hung for good).
            while not self._stop.is_set():
                self._grown.wait()
                if self._stop.wait(every):  # the commits of the next ``every`` seconds: one checkpoint
                    break
                self._grown.clear()  # a commit from now on asks for the next one
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    self.error = f"checkpoint of {path} failed: {exc}"
                    self._grown.set()  # tried again in ``every`` seconds, commits or not
                else:
                    self.error = None
                    self.done += 1
        finally:
            db.close()
