"""The watchfiles driver of the file tailer: which files to poll, and when.

At start every followed file under the watched directories is polled (a generation
the ledger already knows resumes at its stored offset; one that vanished meanwhile is
recorded as deleted). Then watchfiles (Rust ``notify``: inotify/FSEvents, recursive,
so directories created later are watched too) reports changes; watchfiles' default
debounce groups changes for up to 1.6 s, so it is tuned down here (``DEBOUNCE_MS``,
``STEP_MS``) to meet the 200 ms append→ledger budget. A directory that appears is
scanned at once (files may be written into it before its watch is in place), and a
cheap rescan (a stat per file, reading only files that changed) runs shortly after
start and then every ``RESCAN_EVERY`` seconds, so nothing a dropped notification
missed stays unread. Each batch the tailer yields is handed to ``send`` (the daemon's
inbox) in file order; the daemon writes its events and offsets in one transaction.

A watched directory that does not exist yet (``~/.claude/projects`` before Claude Code's
first session) is waited for: its existence is looked at every ``APPEAR_EVERY``
seconds, and once it appears the watcher starts again with it and reads what was
already written into it. One that is removed is waited for again the same way. Each
change is logged once.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from watchfiles import Change, awatch

from tillerman.ledger.changes import RUST_TIMEOUT_MS  # the same for every watch of ours
from tillerman.monitor.tailer import FileBatch, Tailer, followed, scan

log = logging.getLogger("tillerman.watch")

DEBOUNCE_MS = 30  # longest wait to group a burst of changes (watchfiles default: 1600)
STEP_MS = 15  # a burst ends after this long without a change (watchfiles default: 50)
RESCAN_FIRST = 1.0  # seconds after start: catches what changed before the watch was in place
RESCAN_EVERY = 30.0
RESTART_DELAY = 1.0  # after the watcher itself failed
APPEAR_EVERY = 1.0  # seconds between looks at whether a watched directory appeared or went

Send = Callable[[FileBatch], Awaitable[None]]


class Watch:
    def __init__(self, roots: Iterable[str], tailer: Tailer, send: Send, *, debounce_ms: int = DEBOUNCE_MS,
                 step_ms: int = STEP_MS, rescan_every: float = RESCAN_EVERY, force_polling: bool | None = None,
                 appear_every: float = APPEAR_EVERY):
        self.roots = [os.path.abspath(r) for r in roots]
        self.appear_every = appear_every
        self.waiting: list[str] = []  # roots that do not exist (yet): watched once they appear
        self.tailer = tailer
        self.send = send
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.rescan_every = rescan_every
        self.force_polling = force_polling
        self._lock = anyio.Lock()  # polls of the watcher and the rescans never interleave
        self._seen: set[str] = set()  # roots that were there once: one that goes "is gone"

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            present = self._present()
            tg.start_soon(self._rescans)
            task_status.started()
            while True:
                with anyio.CancelScope() as roots_changed:
                    tg.start_soon(self._until_roots_change, present, roots_changed)
                    try:
                        await self._watch(tg, present)
                    except Exception as exc:  # noqa: BLE001 - a watched directory removed, a notify error
                        log.error("watch: the watcher stopped (%s); restarting it, rescanning meanwhile", exc)
                roots_changed.cancel()  # the watcher failed: the look for roots ends with it
                if roots_changed.cancelled_caught:  # a root appeared or went: watch what is there now
                    before, present = present, self._present()
                    tg.start_soon(self._catch_up, [r for r in present if r not in before])
                    continue
                await anyio.sleep(RESTART_DELAY)
                tg.start_soon(self.rescan)

    def _present(self) -> list[str]:
        """The roots that are directories now; the others are waited for (said once
        each time one starts or stops being there)."""
        present = [r for r in self.roots if os.path.isdir(r)]
        waiting = [r for r in self.roots if r not in present]
        for root in waiting:
            if root not in self.waiting:
                log.warning("watch: %s %s: following it once it appears", root,
                            "does not exist yet" if root not in self._seen else "is gone")
        for root in present:
            if root in self.waiting:
                log.warning("watch: %s appeared: following it", root)
        self._seen.update(present)
        self.waiting = waiting
        return present

    async def _until_roots_change(self, present: list[str], scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` once a root appears or goes; return when it is cancelled."""
        while not scope.cancel_called:
            if [r for r in self.roots if os.path.isdir(r)] != present:
                scope.cancel()
                return
            await anyio.sleep(self.appear_every)

    async def _catch_up(self, roots: list[str]) -> None:
        """After the watcher restarted: read what was written into directories that just
        appeared, then, once the new watch is surely in place, whatever changed anywhere
        while no watcher ran (as at start)."""
        async with self._lock:
            for path in scan(roots):
                await self._poll(path)
        await anyio.sleep(RESCAN_FIRST)
        await self.rescan()

    async def _watch(self, tg, present: list[str]) -> None:
        if not present:
            await anyio.sleep_forever()  # until a root appears
        async for changes in awatch(*present,
                                    watch_filter=None, debounce=self.debounce_ms, step=self.step_ms,
                                    rust_timeout=RUST_TIMEOUT_MS, recursive=True, ignore_permission_denied=True,
                                    force_polling=self.force_polling):
            try:
                await self.changed(changes)
            except Exception:  # noqa: BLE001 - never stop following over one bad change
                log.exception("watch: handling %d changes failed", len(changes))
                tg.start_soon(self.rescan)

    async def changed(self, changes: set[tuple[Change, str]]) -> None:
        polls: set[str] = set()
        gone: set[str] = set()
        for change, path in changes:
            if change == Change.deleted:
                if followed(path):
                    gone.add(path)
                else:  # maybe a directory: everything followed under it is gone
                    prefix = path.rstrip(os.sep) + os.sep
                    gone.update(p for p in self.tailer.paths if p.startswith(prefix))
            elif followed(path):
                polls.add(path)
            elif change == Change.added and _is_dir(path):
                polls.update(scan([path]))  # written into before its own watch was in place
        async with self._lock:
            for path in sorted(polls):  # renames: the new name first, so a rotation is not a deletion
                await self._poll(path)
            for path in sorted(gone - polls):
                for batch in self.tailer.gone(path):
                    await self.send(batch)

    async def rescan(self, *, start: bool = False) -> None:
        """Poll every followed file whose stat differs from what was read; at start,
        every file, then record generations that vanished while nobody watched."""
        async with self._lock:
            present: set[str] = set()
            for path in scan(self.roots):
                present.add(path)
                if not start:
                    try:
                        st = os.stat(path, follow_symlinks=False)
                    except OSError:
                        continue
                    if not self.tailer.stale(path, st):
                        continue
                await self._poll(path)
                await anyio.lowlevel.checkpoint()
            batches = self.tailer.forget_missing(present) if start else self._vanished(present)
            for batch in batches:
                await self.send(batch)

    def _vanished(self, present: set[str]):
        for path in [p for p in self.tailer.paths if p not in present]:
            yield from self.tailer.gone(path)

    async def _poll(self, path: str) -> None:
        for batch in self.tailer.poll(path):
            await self.send(batch)

    async def _rescans(self) -> None:
        await self.rescan(start=True)
        await anyio.sleep(RESCAN_FIRST)
        while True:
            await self.rescan()
            await anyio.sleep(self.rescan_every)


def never_a_folder(root: str) -> str | None:
    """Why ``root`` can never be a directory to watch, or None: it is one, or it may
    become one (every part of it that exists is a directory). A file in the way, or a
    part that cannot be looked at, is a reason."""
    path = Path(os.path.abspath(root))
    for part in (path, *path.parents):
        try:
            mode = os.stat(part).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet), or a file above it: the first part that exists tells
        except OSError as exc:
            return f"{part}: cannot look at it ({exc.strerror or exc})"
        if stat.S_ISDIR(mode):
            return None
        return f"{part} is not a directory" if part == path else f"{part} is a file, in the way of {path}"
    return None


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
