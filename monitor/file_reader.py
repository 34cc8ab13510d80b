"""A session file read whole, for replay: its events with their ids, chunk by chunk, and
at its end the file's account (records, unknown types, counts, threads).

    reader = FileReader(path, parser, identity, chunk)  # or ForkedFileReader(...)
    for done, events in reader.chunks():                # done: bytes read so far
        ...                                             # FileEvent: id, event, at, offset, length
    reader.account                                      # FileAccount, once chunks() is done

A ``FileEvent`` is what the live tailer's ``file_envelope`` makes of a parsed record, but
its observation time, which replay takes from its virtual clock.

``ForkedFileReader`` gives exactly what ``FileReader`` gives (the child runs one), with
the reading and parsing on a second core: decoding each line and building its events
are half of a replay's work, and the other half (fold, rules, chain, ledger) needs
nothing but the events. Their ids (a SHA-256 each) and counts are made on the side with
time for them (``ids_in_child``): in the child where the replay chains the rows, here
where it does not (in memory, a file read once: then parsing is the slower half).
The child is forked (it has every module
the parser runs imported already, and starts in about a millisecond), uses nothing of
the parent's but the file and the parser, and leaves with ``os._exit``: no ``atexit``
handler or finalizer of the parent's objects (an open SQLite ledger among them) runs in
it. Batches cross a pipe, msgpack-encoded, each behind its length
(``tillerman.ledger.frames``): memory stays flat however far ahead the child could run.
The child ignores SIGINT (Ctrl-C reaches this process, which ends it) and ends on a
broken pipe when this process stops reading. A read error in the child is raised here
as the ``OSError`` a read here would raise; a child that ends before the end of the file
is a ``ReaderDied``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator

import msgspec

from tillerman.ledger import frames
from tillerman.ledger.events import AnyEvent
from tillerman.monitor.counts import Counts, EventCounter
from tillerman.monitor.identity import event_ids
from tillerman.monitor.parser import Parsed, Parser


class FileEvent(msgspec.Struct, frozen=True, array_like=True):
    """A parsed event and its id (``file_event_id``); an array on a pipe."""

    event_id: str
    event: AnyEvent
    at: float | None  # source time (epoch seconds UTC); None when the format has none
    offset: int  # byte offset of the source record
    length: int  # byte length of the record, newline included


class FileAccount(msgspec.Struct, frozen=True, array_like=True):
    """What a file held, counted once it is read to its end."""

    records: int
    unknown_types: dict[str, int]
    counts: Counts
    threads: list[str]  # the thread ids its events name, in sorted order


class ReaderDied(Exception):
    """The child reading a file ended before the end of it."""


class FileReader:
    """The file read and parsed in this process."""

    def __init__(self, path: str, parser: Parser, identity: str, chunk: int) -> None:
        self.path, self.parser, self.identity, self.chunk = path, parser, identity, chunk
        self.account: FileAccount | None = None

    def chunks(self) -> Iterator[tuple[int, list[FileEvent]]]:
        identify = _Identify(self.identity)
        for done, parsed in self._parsed():
            yield done, identify(parsed)
        self.account = identify.account(*self._read())

    def _parsed(self) -> Iterator[tuple[int, list[Parsed]]]:
        """The file's events chunk by chunk (``_read`` once they are all read)."""
        parser = self.parser
        done = 0
        with open(self.path, "rb") as fh:
            while data := fh.read(self.chunk):
                done += len(data)
                yield done, parser.feed(data)
        yield done, parser.close()

    def _read(self) -> tuple[int, dict[str, int]]:
        """The records the file held and its unknown types, counted."""
        return self.parser.records, dict(sorted(self.parser.unknown_types.items()))


class _Identify:
    """The events of one file given their ids (``file_event_id``), counted with the
    threads they name, as they go by: one pass, on whichever side of the pipe makes
    the ids."""

    def __init__(self, identity: str) -> None:
        self._event_id = event_ids(identity)
        self._counter = EventCounter()
        self._threads: set[str] = set()

    def __call__(self, parsed: list[Parsed]) -> list[FileEvent]:
        count, threads, event_id = self._counter.add, self._threads, self._event_id
        out = []
        for p in parsed:
            event = p.event
            count(event)
            if event.thread_id is not None:
                threads.add(event.thread_id)
            out.append(FileEvent(event_id(p.offset, p.index), event, p.at, p.offset, p.length))
        return out

    def account(self, records: int, unknown_types: dict[str, int]) -> FileAccount:
        return FileAccount(records, unknown_types, self._counter.counts(), sorted(self._threads))


class _Chunk(msgspec.Struct, array_like=True, tag=True):
    done: int
    events: list[Parsed]  # ids made on the reading side


class _NamedChunk(msgspec.Struct, array_like=True, tag=True):
    done: int
    events: list[FileEvent]  # ids made in the child


class _End(msgspec.Struct, array_like=True, tag=True):
    account: FileAccount  # after ``_NamedChunk``s


class _Read(msgspec.Struct, array_like=True, tag=True):
    records: int  # after ``_Chunk``s: the rest of the account is counted as they are named
    unknown_types: dict[str, int]


class _Failed(msgspec.Struct, array_like=True, tag=True):
    errno: int
    strerror: str


_Message = _Chunk | _NamedChunk | _End | _Read | _Failed
_decode = msgspec.msgpack.Decoder(_Message).decode


class ForkedFileReader(FileReader):
    """The file read and parsed by a ``FileReader`` in a forked child (see the module);
    ``ids_in_child``: the child makes the events' ids too, and counts them."""

    def __init__(self, path: str, parser: Parser, identity: str, chunk: int, *, ids_in_child: bool = True) -> None:
        super().__init__(path, parser, identity, chunk)
        self.ids_in_child = ids_in_child

    def chunks(self) -> Iterator[tuple[int, list[FileEvent]]]:
        read_fd, write_fd = os.pipe()
        try:
            frames.widen(write_fd)
            pid = os.fork()
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the child: read, send, leave without running anything of the parent's
            status = 1
            try:
                os.close(read_fd)
                status = self._send_all(write_fd)
            except BaseException:  # a fault of ours: said here, and the parent names the exit
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(status)
        os.close(write_fd)
        reaped = False
        identify = _Identify(self.identity)
        try:
            with open(read_fd, "rb", buffering=frames.PIPE_BYTES) as pipe:
                while (message := _receive(pipe)) is not None:
                    if isinstance(message, _NamedChunk):
                        yield message.done, message.events
                    elif isinstance(message, _Chunk):
                        yield message.done, identify(message.events)
                    elif isinstance(message, _End):
                        self.account = message.account
                        return
                    elif isinstance(message, _Read):
                        self.account = identify.account(message.records, message.unknown_types)
                        return
                    else:
                        raise OSError(message.errno, message.strerror, self.path)
            reaped = True
            raise ReaderDied(f"{self.path}: the process reading it ended before the end of the file"
                             f" ({_reap(pid)}); replay it with --jobs 1 to read it in this process")
        finally:
            if not reaped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # finished, or no longer listened to
                os.waitpid(pid, 0)

    def _send_all(self, write_fd: int) -> int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        encode = msgspec.msgpack.Encoder().encode
        reader = FileReader(self.path, self.parser, self.identity, self.chunk)
        with open(write_fd, "wb", buffering=0) as pipe:
            def send(message: _Message) -> None:
                frames.send(pipe, encode(message))

            try:
                if self.ids_in_child:
                    for done, events in reader.chunks():
                        send(_NamedChunk(done, events))
                    assert reader.account is not None
                    send(_End(reader.account))
                else:
                    for done, parsed in reader._parsed():
                        send(_Chunk(done, parsed))
                    send(_Read(*reader._read()))
            except BrokenPipeError:
                return 1  # the reader is gone: nobody to tell
            except OSError as exc:
                send(_Failed(exc.errno or 0, exc.strerror or str(exc)))
        return 0


def _receive(pipe) -> _Message | None:
    """The next message, or None at the end of the pipe (a message cut short included)."""
    body = frames.receive(pipe)
    return None if body is None else _decode(body)


def _reap(pid: int) -> str:
    """How the child ended."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
