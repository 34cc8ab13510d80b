"""The ledger's change feed as server-sent events.

One ``Live`` per server process follows the ledger's change feed (``Recorder.change_feed``:
the SQLite WAL watcher, PostgreSQL LISTEN/NOTIFY), as the daemon does, and on each commit
reads only the rows after the last seq it folded into ONE projection, kept up to date
(``Projection.apply``): the pages render from it, and no change refolds the ledger. What
changed (which threads, which intents) is gathered and sent to every open page at most
every ``COALESCE`` seconds, as one SSE message carrying the last seq folded (so a test or a
benchmark can measure commit → delivery); the page's script (``static/dashboard.js``,
one ``EventSource``) then asks htmx for the fragments of what changed.

Reading the ledger runs in worker threads, never on the event loop: ``lock`` is held
while the projection is read or folded (by the routes, by the publisher), and a burst of
commits costs one read.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from tillerman.ledger import projections
from tillerman.ledger.changes import ChangeFeed
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.events import Entry
from tillerman.ledger.projections import Projection
from tillerman.ledger.recorder import Recorder

log = logging.getLogger(__name__)

COALESCE = 0.1  # at most one message per page this often: a busy fleet is not a message per row
KEEPALIVE = 15.0  # a comment this often keeps proxies and the browser from closing a quiet stream
RETRY_FEED = 1.0  # a lost feed (a database connection dropped) is followed again after this
READ_BATCH = 5000  # rows folded per read: a long backlog is read in slices, the loop served between
#: Messages a slow page may fall behind. Past that its stream is ended rather than thinned:
#: a dropped message's threads would stay stale on it, while the browser reconnects at
#: once and the new stream's hello (its seq) makes the page fetch every live part again.
SUBSCRIBER_BUFFER = 8


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """What one SSE message tells a page: the last seq folded and what changed since the
    previous message."""

    seq: int
    threads: tuple[str, ...] = ()
    intents: tuple[str, ...] = ()


class Fold(Protocol):
    """A view kept beside the projection, folded one row at a time (the fleet's sightings
    and today's usage)."""

    def apply(self, entry: Entry) -> None: ...


class Live:
    """``folds``: views folded from the ledger's first row (the projection itself starts
    from its saved snapshot), then with every row the feed announces."""

    def __init__(self, recorder: Recorder, *, folds: Sequence[Fold] = (), coalesce: float = COALESCE) -> None:
        self.recorder = recorder
        self.coalesce = coalesce
        self.folds = folds
        self.projection: Projection = projections.load(recorder)
        if folds:
            for entry in recorder.read(after_seq=0):
                if entry.seq > self.projection.seq:
                    break
                for fold in folds:
                    fold.apply(entry)
        self.lock = threading.RLock()  # the projection, the folds and the recorder's one connection
        self._sent_seq = self.projection.seq  # the last seq a message announced
        self._threads: set[str] = set()
        self._intents: set[str] = set()
        self._pages: set[MemoryObjectSendStream[Change]] = set()
        self._ended = False  # the server is stopping: streams end (``end_streams``)
        self._woken = anyio.Event()
        self._loop: tuple[int, anyio.lowlevel.EventLoopToken] | None = None  # (thread id, token) once running

    @property
    def seq(self) -> int:
        return self.projection.seq

    def catch_up(self) -> bool:
        """Fold the rows committed since the last one folded; whether there were any."""
        with self.lock:
            return self._catch_up()

    def _catch_up(self) -> bool:
        read = False
        while True:
            entries = list(self.recorder.read(after_seq=self.projection.seq, limit=READ_BATCH))
            for entry in entries:
                event = entry.envelope.event
                self.projection.apply(entry)
                for fold in self.folds:
                    fold.apply(entry)
                if (intent_id := getattr(event, "intent_id", None)) is not None:
                    self._intents.add(intent_id)
                    if (view := self.projection.intents.get(intent_id)) is not None:
                        self._threads.add(view.intent.thread_id)
                if (thread_id := getattr(event, "thread_id", None)) is not None:
                    self._threads.add(thread_id)
                # a label or a resolved notice names its subject's thread as ``thread``
                if isinstance(thread := getattr(event, "thread", None), str):
                    self._threads.add(thread)
            read = read or bool(entries)
            if len(entries) < READ_BATCH:
                return read

    def refresh(self) -> None:
        """Before a page renders: what was committed and not yet announced, folded now.
        The publisher, woken by the feed a moment later, finds nothing left to fold but
        still sends what this folded (it compares the seq with the last one sent)."""
        if self.catch_up():
            self._wake()

    def _wake(self) -> None:
        """Wake the publisher, from the event loop or from a route's worker thread (an
        ``anyio.Event`` is set on its loop only)."""
        if self._loop is None or self._loop[0] == threading.get_ident():
            self._woken.set()
        else:
            anyio.from_thread.run_sync(self._woken.set, token=self._loop[1])

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the ledger until cancelled: the feed wakes the publisher, which folds
        and sends at most every ``coalesce`` seconds. Started with ``TaskGroup.start``, it
        returns once the feed is in place (PostgreSQL: LISTENing), so that a server
        started after it serves no page a commit could then miss."""
        self._loop = (threading.get_ident(), anyio.lowlevel.current_token())
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._publish)
            await self._follow(task_status)

    async def _follow(self, task_status: TaskStatus[None]) -> None:
        feed = await self._feed()
        task_status.started()
        while feed is not None:  # None: a ledger no other process writes, nothing to follow
            try:
                async for _ in feed:
                    self._woken.set()
            except OperationalError as exc:
                log.warning("ledger change feed lost (%s); following it again", exc)
            finally:
                feed.close()
            await anyio.sleep(RETRY_FEED)
            feed = await self._feed()

    async def _feed(self) -> ChangeFeed | None:
        """The ledger's change feed, in place; what was committed before it was (since the
        projection was loaded, or while a lost feed was replaced) no commit will announce,
        so the publisher is woken to read it now."""
        feed = await anyio.to_thread.run_sync(self.recorder.change_feed)
        self._woken.set()
        return feed

    async def _publish(self) -> None:
        while True:
            await self._woken.wait()
            self._woken = anyio.Event()
            if (change := await anyio.to_thread.run_sync(self._pending)) is not None:
                self._send(change)
            await anyio.sleep(self.coalesce)

    def _pending(self) -> Change | None:
        """In a worker thread (the lock may be held by a page's render): fold what is new,
        and what to announce — also what a page's ``refresh`` folded first, which this
        catch-up finds already folded (the seq is past the last one sent)."""
        with self.lock:
            self._catch_up()
            if not (self._threads or self._intents or self.seq > self._sent_seq):
                return None
            change = Change(seq=self.projection.seq, threads=tuple(sorted(self._threads)),
                            intents=tuple(sorted(self._intents)))
            self._sent_seq = change.seq
            self._threads.clear()
            self._intents.clear()
            return change

    def _send(self, change: Change) -> None:
        for page in list(self._pages):
            try:
                page.send_nowait(change)
            except anyio.WouldBlock:  # a page behind: ended, it reconnects and catches up (SUBSCRIBER_BUFFER)
                self._pages.discard(page)
                page.close()

    def end_streams(self) -> None:
        """End every page's stream, and any opened later (the server is stopping): in the
        event loop's thread."""
        self._ended = True
        for page in list(self._pages):
            page.close()
        self._pages.clear()

    async def events(self, *, keepalive: float = KEEPALIVE) -> AsyncIterator[str]:
        """One page's stream, as ``text/event-stream`` text: first the seq it starts from,
        then a ``change`` event per message, and a comment when quiet; it ends when the
        page fell ``SUBSCRIBER_BUFFER`` messages behind."""
        send, receive = anyio.create_memory_object_stream[Change](SUBSCRIBER_BUFFER)
        if self._ended:
            send.close()
        else:
            self._pages.add(send)
        try:
            yield sse("hello", Change(seq=self.projection.seq))
            while True:
                with anyio.move_on_after(keepalive if keepalive > 0 else math.inf) as scope:
                    try:
                        change = await receive.receive()
                    except anyio.EndOfStream:  # ended by _send: the page fell behind
                        return
                yield ": keepalive\n\n" if scope.cancelled_caught else sse("change", change)
        finally:
            self._pages.discard(send)
            send.close()
            receive.close()


def sse(event: str, change: Change) -> str:
    """One server-sent event; its ``id`` is the seq, its data the change as JSON (one line)."""
    return f"event: {event}\nid: {change.seq}\ndata: {json.dumps(msgspec.to_builtins(change))}\n\n"
