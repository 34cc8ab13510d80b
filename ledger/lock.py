"""Only one daemon may own a SQLite ledger at a time.

The lock is an ``flock`` on ``LEDGER.lock`` held for the daemon's life; the file
names the holder's pid so a second daemon can say who has it. The kernel drops the
lock when the holder dies, even by SIGKILL, so a crash never leaves a stale lock.
Other writers (``tillerman intent propose``) do not take it: the ledger's own
transactions keep them safe. ``tillerman ledger archive`` takes it, so it never moves
rows out from under a running daemon.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tillerman.ledger.errors import LedgerLocked
from tillerman.ledger.paths import ledger_files


class LedgerLock:
    def __init__(self, ledger_path: str | os.PathLike, *,
                 advice: str = "stop it first, or give this one its own --ledger") -> None:
        self.path = Path(ledger_files(ledger_path).lock)  # one lock whatever name the ledger is given
        self.advice = advice  # what the refusal tells the person to do
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LedgerLocked(
                f"another tillerman daemon (pid {holder}) owns {self.path.with_suffix('')}; {self.advice}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def held(self) -> bool:
        """Whether a daemon holds the lock right now, without taking it for longer than
        the probe (``tillerman status``)."""
        if not self.path.exists():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LedgerLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
