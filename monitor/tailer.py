"""Following session files as they grow: one generation per file, resumable offsets.

``Tailer.poll(path)`` is called whenever a file may have changed (a watcher saw it, a
rescan found it different, the daemon started). It reads only the bytes it has not
read before, through the same format parser and the same envelope construction as
offline replay (``file_envelope``), so a file followed live and the same file replayed
give the same envelopes. Each ``FileBatch`` it yields carries the events of a span and
the ``FileOffset`` just past it; the ledger writes both in one transaction, so a
restart resumes exactly there. Nothing here talks to a watcher or to the ledger: the
driver (``tillerman.monitor.watch``) and the daemon do.

Generations. A file is its identity — device, inode and a digest of its first line
(``tillerman.monitor.identity``) — and event ids are that identity plus the record's offset, so
re-reading a span can never append a fact twice. The identity is taken only once the
first line is complete (or longer than the digest's limit), because replay sees the
whole first line. A file that shrinks below what was read, or whose first line
changed, was truncated or rewritten: a ``quarantined{reason: file_truncated}`` record
keeps the evidence and the file is read again from its start as a (possibly new)
generation. A new inode at a known path is a replacement: the old generation is marked
``replaced`` and followed on from its offset if it shows up at another path (rotation);
its events keep the source name they started with. A file that disappears is recorded
as ``quarantined{reason: file_deleted}`` (its offset, and the bytes of a partial last
line never completed) and its row is marked ``deleted``.

Resuming. Parsers carry context across records (the thread, the open turn, open tool
calls), so after a restart a generation's parser is rebuilt by feeding it the bytes
before the stored offset with its output dropped — lazily, only when the file grows.

Partial lines: the parser holds an incomplete last line; the offset never passes it.
Hostile input (bad JSON, invalid UTF-8, NUL bytes, over-long lines, deep nesting, wrong types) is
quarantined by the parser; an unreadable file, a symlink loop or a file whose format
cannot be told is logged once and recorded as a ``quarantined`` event. Nothing
raises out of ``poll``.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from tillerman.ledger.events import Envelope, Quarantined, TurnCompleted, TurnStarted
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.command_patterns import DEFAULT, CommandPatterns
from tillerman.monitor.formats import PARSERS, detect_format, layout_note
from tillerman.monitor.identity import FIRST_LINE_LIMIT, file_event_id, stat_identity
from tillerman.monitor.lines import MAX_LINE
from tillerman.monitor.parser import Parsed, Parser

log = logging.getLogger("tillerman.tailer")

SUFFIX = ".jsonl"  # what is followed under a watched directory
CHUNK = 1 << 20  # bytes read per step: memory stays flat in file size
HEAD = 64 * 1024  # as much as replay looks at to tell a format
FILE_SOURCE = "file:"  # what the source name of a file's events starts with

# Reasons of the quarantine records the tailer itself writes (the parser writes the rest).
FILE_DELETED = "file_deleted"
FILE_TRUNCATED = "file_truncated"
UNREADABLE = "unreadable"
SYMLINK_LOOP = "symlink_loop"
UNKNOWN_FORMAT = "unknown_format"


def file_source(path: str | os.PathLike) -> str:
    """The source name of a file's events (replay and the tailer use the same)."""
    return f"{FILE_SOURCE}{path}"


def is_file_source(source: str) -> bool:
    """Whether ``source`` names a file's events: an observation, not a record of tillerman's own."""
    return source.startswith(FILE_SOURCE)


def file_envelope(identity: str, source: str, parsed: Parsed, *, observed_at: float | None = None) -> Envelope:
    """The envelope of one parsed record: shared by replay (observed on its virtual
    clock: ``observed_at``) and the live tailer (unset: the ledger's clock)."""
    return Envelope(
        event_id=file_event_id(identity, parsed.offset, parsed.index), event=parsed.event,
        source=source, at=parsed.at, observed_at=observed_at, offset=parsed.offset, length=parsed.length,
    )


def marker_id(key: str, what: str, offset: int) -> str:
    """Id of a record the tailer writes about a file (never equal to a record's id)."""
    return "f-" + hashlib.sha256(f"{key}|{what}|{offset}".encode()).hexdigest()[:32]


class FileBatch(msgspec.Struct, frozen=True):
    """Events read from one span of one file, and where that file is read up to now.
    The ledger must write both in one transaction."""

    envelopes: list[Envelope]
    offsets: list[FileOffset]


@dataclass(eq=False)
class _Generation:
    path: str
    dev: int
    ino: int
    identity: str
    source: str
    format: str
    first_line: bytes
    offset: int  # consumed: on a line boundary, everything before it is emitted
    parser: Parser | None = None  # built on first growth (resumed generations too)
    read: int = 0  # bytes fed to the parser (offset + a held partial line)
    size: int = 0  # size at the last poll
    mtime_ns: int = 0


@dataclass(eq=False)
class _Pending:
    """A file whose identity cannot be taken yet (first line incomplete) or whose
    format cannot be told yet."""

    dev: int
    ino: int
    size: int = 0
    mtime_ns: int = 0


@dataclass
class Tailer:
    known: Iterable[FileOffset] = ()
    patterns: CommandPatterns = DEFAULT
    retain_payloads: bool = False
    max_line: int = MAX_LINE
    chunk: int = CHUNK
    clock: Callable[[], float] = time.time
    _rows: dict[str, FileOffset] = field(default_factory=dict)  # identity -> last offset row
    _live: dict[str, _Generation] = field(default_factory=dict)  # path -> generation read there
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _refused: set[tuple[str, str]] = field(default_factory=set)  # (path, reason) logged this run
    _ignored: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (dev, ino) of unknown format

    def __post_init__(self) -> None:
        self._rows = {row.identity: row for row in self.known}

    def use_patterns(self, patterns: CommandPatterns) -> None:
        """A reloaded configuration: files already open classify with it from now on too."""
        self.patterns = patterns
        for gen in self._live.values():
            if gen.parser is not None:
                gen.parser.use_patterns(patterns)

    # -- what is followed ------------------------------------------------------------

    @property
    def paths(self) -> list[str]:
        return list(self._live)

    def rows(self) -> list[FileOffset]:
        return list(self._rows.values())

    def offset_of(self, path: str) -> int | None:
        gen = self._live.get(path)
        return gen.offset if gen else None

    def stale(self, path: str, st: os.stat_result) -> bool:
        """Whether a stat shows something this tailer has not read (a rescan's test)."""
        gen = self._live.get(path)
        if gen is not None:
            return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (gen.dev, gen.ino, gen.size, gen.mtime_ns)
        pending = self._pending.get(path)
        if pending is not None:
            return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (
                pending.dev, pending.ino, pending.size, pending.mtime_ns)
        return self._ignored.get(path) != (st.st_dev, st.st_ino)

    # -- polling ---------------------------------------------------------------------

    def poll(self, path: str) -> Iterator[FileBatch]:
        """Read what ``path`` gained since the last poll; never raises."""
        try:
            yield from self._poll(path)
        except Exception as exc:  # noqa: BLE001 - the tailer keeps following everything else
            log.exception("%s: cannot follow (%s); will retry on its next change", path, exc)

    def _poll(self, path: str) -> Iterator[FileBatch]:
        try:
            lst = os.lstat(path)
        except FileNotFoundError:
            yield from self.gone(path)
            return
        if stat.S_ISLNK(lst.st_mode):
            yield from self._symlink(path)
            return
        if not stat.S_ISREG(lst.st_mode):
            self._refuse_once(path, "not a regular file", log.info)
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            yield from self.gone(path)
            return
        except PermissionError:
            yield from self._refuse(path, UNREADABLE, lst)
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                yield from self._symlink(path)
                return
            raise
        try:
            yield from self._read(path, fd, os.fstat(fd))
        finally:
            os.close(fd)

    def _read(self, path: str, fd: int, st: os.stat_result) -> Iterator[FileBatch]:
        self._refused.discard((path, UNREADABLE))
        gen = self._live.get(path)
        if gen is not None and (gen.dev, gen.ino) != (st.st_dev, st.st_ino):
            yield from self._replaced(gen)
            gen = None
        if gen is not None and (st.st_size < max(gen.read, gen.offset) or _pread(fd, len(gen.first_line), 0) != gen.first_line):
            yield from self._truncated(gen, st)
            gen = None
        if gen is None:
            if self._ignored.get(path) == (st.st_dev, st.st_ino):
                return
            gen, batch = self._start(path, fd, st)
            if batch is not None:
                yield batch
            if gen is None:
                return
        gen.size, gen.mtime_ns = st.st_size, st.st_mtime_ns
        if gen.parser is None:
            if st.st_size <= gen.offset:
                return  # a resumed generation that has not grown: no need to rebuild its parser
            self._rebuild(gen, fd)
        yield from self._grow(gen, fd)

    def _start(self, path: str, fd: int, st: os.stat_result) -> tuple[_Generation | None, FileBatch | None]:
        """A file not read at this path before: take its identity once its first line is
        complete, resume its generation if the ledger knows it, else tell its format."""
        self._pending.pop(path, None)
        head = _pread(fd, HEAD, 0)
        newline = head.find(b"\n", 0, FIRST_LINE_LIMIT)
        if newline < 0 and len(head) < FIRST_LINE_LIMIT:
            self._pending[path] = _Pending(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            return None, None  # the first line is still being written
        first_line = head[: newline + 1] if newline >= 0 else head[:FIRST_LINE_LIMIT]
        identity = stat_identity(st, first_line)
        row = self._rows.get(identity)
        if row is not None and row.offset > st.st_size:
            # Shrunk while nobody watched: the same identity, read again from its start.
            gen = _Generation(path, st.st_dev, st.st_ino, identity, row.source, row.format, first_line, row.offset)
            batch = self._truncation(gen, st)
            row = self._rows[identity]
            gen.offset = 0
            self._live[path] = gen
            return gen, batch
        if row is not None:
            moved = row.path != path
            old = self._live.get(row.path) if moved else None
            if old is not None and old.identity == identity:
                del self._live[row.path]  # rotated under our eyes: keep its parser and position
                gen = old
                gen.path = path
            else:
                gen = _Generation(path, st.st_dev, st.st_ino, identity, row.source, row.format, first_line,
                                  row.offset)
            if moved:
                log.info("%s: the file first seen at %s (rotated): following on from offset %d",
                         path, row.path, gen.offset)
            self._live[path] = gen
            if moved or row.state != "following":
                return gen, FileBatch([], [self._row(gen)])
            return gen, None
        fmt = detect_format(head, path)
        if fmt is None:
            note = layout_note(head)  # told from a whole first line: more bytes would not change it
            if note is None and len(head) < HEAD and not head.endswith(b"\n"):
                # More lines may still tell (replay looks at up to HEAD bytes).
                self._pending[path] = _Pending(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                return None, None
            self._ignored[path] = (st.st_dev, st.st_ino)
            log.warning("%s: %s: not followed", path, note or "cannot tell its format")
            event = Quarantined(source=file_source(path), offset=0, length=st.st_size, reason=UNKNOWN_FORMAT)
            env = Envelope(event_id=marker_id(identity, UNKNOWN_FORMAT, 0), event=event,
                           source=file_source(path), offset=0, length=st.st_size)
            return None, FileBatch([env], [])
        gen = _Generation(path, st.st_dev, st.st_ino, identity, file_source(path), fmt, first_line, 0)
        self._live[path] = gen
        log.info("%s: following it as %s", path, fmt)
        return gen, None

    def _new_parser(self, gen: _Generation) -> Parser:
        return PARSERS[gen.format](gen.source, patterns=self.patterns, retain_payloads=self.retain_payloads,
                                   max_line=self.max_line)

    def _rebuild(self, gen: _Generation, fd: int) -> None:
        """Bring a resumed generation's parser to its stored offset (output dropped:
        the ledger has it) so the records after it read as they would in one pass."""
        parser = self._new_parser(gen)
        position = 0
        while position < gen.offset:
            data = _pread(fd, min(self.chunk, gen.offset - position), position)
            if not data:
                break
            parser.feed(data)
            position += len(data)
        if parser.consumed != gen.offset:
            # The bytes before the offset are not what was read (rewritten in place with
            # the same first line): read on from the offset all the same.
            log.warning("%s: resumed at %d but the file's lines end at %d before it", gen.path, gen.offset,
                        parser.consumed)
            parser = self._new_parser(gen)
            parser._framer._offset = gen.offset  # noqa: SLF001 - align record offsets with the file
        gen.parser, gen.read = parser, gen.offset

    def _grow(self, gen: _Generation, fd: int) -> Iterator[FileBatch]:
        assert gen.parser is not None
        while data := _pread(fd, self.chunk, gen.read):
            gen.read += len(data)
            parsed = gen.parser.feed(data)
            consumed = gen.parser.consumed
            if not parsed and consumed == gen.offset:
                continue  # only a partial line so far: held
            envelopes = [file_envelope(gen.identity, gen.source, p) for p in parsed if p.offset >= gen.offset]
            if log.isEnabledFor(logging.INFO):
                _log_turns(gen.path, envelopes)
            gen.offset = consumed
            yield FileBatch(envelopes, [self._row(gen)])
        gen.size = max(gen.size, gen.read)

    def _row(self, gen: _Generation, state: str = "following") -> FileOffset:
        row = FileOffset(identity=gen.identity, path=gen.path, source=gen.source, format=gen.format,
                         offset=gen.offset, state=state, updated_at=self.clock())
        self._rows[gen.identity] = row
        return row

    # -- generations ending ---------------------------------------------------------------

    def gone(self, path: str) -> Iterator[FileBatch]:
        """The path no longer exists (or a watcher says it was deleted)."""
        self._pending.pop(path, None)
        self._ignored.pop(path, None)
        gen = self._live.pop(path, None)
        if gen is None:
            return
        if os.path.lexists(path):
            self._live[path] = gen  # deleted and recreated: a poll sorts it out
            yield from self.poll(path)
            return
        held = gen.read - gen.offset
        log.info("%s: deleted at offset %d%s", path, gen.offset, f" ({held} bytes of a partial line unread)" if held else "")
        yield self._ended(gen, FILE_DELETED, gen.offset, held, "deleted")

    def forget_missing(self, present: set[str]) -> Iterator[FileBatch]:
        """After a full scan at start: generations the ledger follows that are no longer
        anywhere under the watched directories were deleted while nobody watched."""
        live = {gen.identity for gen in self._live.values()}
        for row in list(self._rows.values()):
            if row.state != "following" or row.identity in live:
                continue
            if row.path in present:  # another file holds its path now
                yield FileBatch([], [msgspec.structs.replace(row, state="replaced", updated_at=self.clock())])
                continue
            log.info("%s: deleted while not followed (read up to offset %d)", row.path, row.offset)
            gen = _Generation(row.path, 0, 0, row.identity, row.source, row.format, b"", row.offset)
            yield self._ended(gen, FILE_DELETED, row.offset, 0, "deleted")

    def _ended(self, gen: _Generation, reason: str, offset: int, length: int, state: str) -> FileBatch:
        event = Quarantined(source=gen.source, offset=offset, length=length, reason=reason)
        env = Envelope(event_id=marker_id(gen.identity, reason, offset), event=event, source=gen.source,
                       offset=offset, length=length)
        return FileBatch([env], [self._row(gen, state)])

    def _replaced(self, gen: _Generation) -> Iterator[FileBatch]:
        log.info("%s: replaced by another file (new inode): reading it from its start", gen.path)
        del self._live[gen.path]
        yield FileBatch([], [self._row(gen, "replaced")])

    def _truncated(self, gen: _Generation, st: os.stat_result) -> Iterator[FileBatch]:
        del self._live[gen.path]
        yield self._truncation(gen, st)

    def _truncation(self, gen: _Generation, st: os.stat_result) -> FileBatch:
        """Evidence of what was read before, and the generation's row back at 0: the
        same identity may come back (same inode, same first line) and is read from 0."""
        log.info("%s: truncated or rewritten (size %d, read %d): reading it again from its start",
                 gen.path, st.st_size, max(gen.read, gen.offset))
        batch = self._ended(gen, FILE_TRUNCATED, 0, gen.offset, "replaced")
        gen.offset = 0
        batch.offsets[0] = self._row(gen, "replaced")
        return batch

    # -- refusals ------------------------------------------------------------------

    def _symlink(self, path: str) -> Iterator[FileBatch]:
        """Symlinks are not followed (as in replay); a loop is hostile input."""
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                yield from self._refuse(path, SYMLINK_LOOP, None)
                return
        self._refuse_once(path, "a symlink: not followed", log.info)

    def _refuse(self, path: str, reason: str, st: os.stat_result | None) -> Iterator[FileBatch]:
        if (path, reason) in self._refused:
            return
        self._refused.add((path, reason))
        log.error("%s: %s: not followed (fix it and touch the file to retry)", path,
                  {UNREADABLE: "no read permission", SYMLINK_LOOP: "a symlink loop"}.get(reason, reason))
        key = f"{st.st_dev}:{st.st_ino}" if st is not None else f"path:{path}"
        size = st.st_size if st is not None else 0
        source = file_source(path)
        event = Quarantined(source=source, offset=0, length=size, reason=reason)
        yield FileBatch([Envelope(event_id=marker_id(key, reason, size), event=event, source=source,
                                  offset=0, length=size)], [])

    def _refuse_once(self, path: str, why: str, say) -> None:
        if (path, why) not in self._refused:
            self._refused.add((path, why))
            say("%s: %s", path, why)


def _pread(fd: int, size: int, offset: int) -> bytes:
    return os.pread(fd, size, offset) if size > 0 else b""


def followed(path: str) -> bool:
    return path.endswith(SUFFIX)


def scan(roots: Iterable[str]) -> Iterator[str]:
    """Every followed file under the roots, sorted per directory; symlinked directories
    are not entered (no loops), unreadable directories are logged and skipped."""
    stack = [str(r) for r in roots]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.error("%s: cannot list (%s)", top, exc.strerror or exc)
            continue
        subdirs = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.path)
                elif followed(entry.name):
                    yield entry.path
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def _log_turns(path: str, envelopes: list[Envelope]) -> None:
    """What following a file found, by file, thread and turn (``run -v``)."""
    for env in envelopes:
        event = env.event
        if isinstance(event, TurnStarted):
            log.info("%s: thread %s: turn %s started", path, event.thread_id, event.turn_id)
        elif isinstance(event, TurnCompleted):
            log.info("%s: thread %s: turn %s %s", path, event.thread_id, event.turn_id, event.status)
