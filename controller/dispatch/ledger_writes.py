"""Waking up when the ledger is written, for SQLite ledgers: the daemon's brain wakes to
decide on an intent another process proposed, and ``tillerman claude`` wakes to claim an
intent the daemon decided. Both carry out decided intents, so the watcher lives here,
below both."""

from pathlib import Path

import watchfiles

from tillerman.ledger.paths import ledger_files
from tillerman.monitor.watch import RUST_TIMEOUT_MS

LEDGER_STEP_MS = 30  # the ledger watcher checks for writes (and for being stopped) this often


async def ledger_writes(path: Path):
    """Yields whenever anyone writes the ledger (another process proposing an intent, a
    delivery task recording an answer): SQLite appends to its WAL file, and the kernel
    tells us. No busy polling, so an idle watcher costs almost nothing."""
    wal = ledger_files(path).wal
    async for changes in watchfiles.awatch(path.parent, watch_filter=lambda change, name: name == wal,
                                           debounce=2 * LEDGER_STEP_MS, step=LEDGER_STEP_MS,
                                           rust_timeout=RUST_TIMEOUT_MS, yield_on_timeout=False, recursive=False):
        yield changes
