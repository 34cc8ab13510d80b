"""A replay into an empty SQLite ledger: rows prepared in the replay's process, inserted
and committed by a process of their own.

Into a ledger, one process did everything for each row: fold and decide, prepare its
digest and chain link, insert it and commit. The inserts and commits were as much again
as the rest (1M-line rollout: 9.1 s in the process against 4.4 in memory). A writer
thread does not take them off: ``sqlite3`` lets go of the GIL for each row's step and
takes it back to bind the next, so the two threads hand it to and fro (10.4–10.7 s). A
second process does (7.8 s): the replay prepares each batch as a replay in memory does
(``tillerman.ledger.chain_only``) and sends its rows down a pipe (``tillerman.ledger.frames``,
msgpack) to ``python -m tillerman.ledger.load_writer LEDGER``, which inserts them as they are
(``SQLiteRecorder.insert_prepared``) and commits where the replay ends a ``bulk()``
block, moving the head anchor as after any commit. The pipe's buffer bounds what is in
flight. The writer is started, not forked: a process that opens a SQLite file must not
be the fork of one that holds it open.

It is only for a ledger with no rows, replaying files each named once
(``Replayer._loading``, ``parallel_replay._appender``): then no id can be offered twice
but those the replay records itself (decisions, intents, reports), which are kept here
with their whole content digests, so a duplicate is dropped and a conflict named exactly
as the SQLite recorder's own lookup would; the observations' ids are never looked up nor
kept (``append_new``). So the rows are the rows a replay through ``SQLiteRecorder.append``
writes, seq for seq and link for link (tests/controller/test_replay_unchanged.py,
tests/ledger/test_load.py). The ids are kept as ``ChainOnlyRecorder`` keeps them, in its
compact table (64-bit name digests, about 13 bytes each), whose tag is here the place of
the whole digest in one ``bytearray``: 57 bytes a record with the buffers' slack, where a
``dict`` of the id and digest strings took about 280 (a replay of 550 rollouts records
16,000 of them, and their ``dict`` was most of what grew in the parent of its workers). Two ids with one 64-bit digest would be taken
for one, as in memory: about n² / 2⁶⁵ for n records.

The writer drops the index of the ids' keys while it inserts and builds it when the pipe
ends (``SQLiteRecorder.keys_indexed_last``): nothing looks an id up in the ledger during a
load, and a random index written row by row costs more than one built from all the rows.

The writer ignores SIGINT (Ctrl-C reaches the replay, which ends the load). When the
pipe ends, with or without a last ``bulk()`` end, it commits what it was sent: whole
prepared batches only, so what it committed is a prefix of the chain. A writer that
fails or dies is raised here (``OperationalError``, with its reason) at the next send or
at ``close``.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import msgspec

from tillerman.ledger import frames
from tillerman.ledger.batch import Prepared, none_stored, prepare, row_columns
from tillerman.ledger.chain_only import ChainOnlyRecorder
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.events import Envelope
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.recorder import AppendResult


class Rows(msgspec.Struct, array_like=True, tag=True):
    """Prepared rows for the writer to insert as they are."""

    columns: list[tuple]  # in ``row_columns`` order


class Commit(msgspec.Struct, array_like=True, tag=True):
    """The end of a ``bulk()`` block: the writer commits what it was sent."""


decode_message = msgspec.msgpack.Decoder(Rows | Commit).decode


DIGEST_BYTES = 32  # a content digest (SHA-256), kept whole: a conflict record names it


class LedgerLoad(ChainOnlyRecorder):
    """Appends prepared here on the chain of an empty ledger at ``path``, written by the
    writer process (see the module). Like ``ChainOnlyRecorder``, its rows cannot be read
    back here; they can from the ledger once ``close`` returns."""

    chains_new = True  # its rows are written: every one is chained

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        # The content digests of the rows ``append`` stored, DIGEST_BYTES each, in the order
        # stored: a row's place here is its tag in the id table.
        self._digests_kept = bytearray()
        self._encode = msgspec.msgpack.Encoder().encode
        # Unbuffered: each message is one write, seen by the writer (or refused) at once.
        self._writer = subprocess.Popen([sys.executable, "-m", "tillerman.ledger.load_writer", path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._failure: OperationalError | None = None
        self._ended = False
        assert self._writer.stdin is not None
        frames.widen(self._writer.stdin.fileno())
        self._pipe = self._writer.stdin

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        if offsets:
            raise ValueError("a load writes events, not file offsets")
        return super().append(batch)

    def append_new(self, batch: Sequence[Envelope]) -> AppendResult:
        """Observations never offered again: their ids neither looked up nor kept, as in
        memory, but their rows are written, so they are chained as ``append`` chains."""
        if not batch:
            return AppendResult()
        return self._appended(prepare(batch, *self.head, time.time(), none_stored, self._state), ())

    def _tag(self, digest: str) -> int:
        kept = self._digests_kept
        kept += bytes.fromhex(digest)
        return len(kept) // DIGEST_BYTES - 1

    def _kept_digest(self, tag: int) -> str:
        return self._digests_kept[tag * DIGEST_BYTES:(tag + 1) * DIGEST_BYTES].hex()

    def _appended(self, prepared: Prepared, offsets: Sequence[FileOffset]) -> AppendResult:
        if prepared.rows:
            self._send(Rows([row_columns(row) for row in prepared.rows]))
        return super()._appended(prepared, offsets)

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """The writer commits where the block ends, what it raises included."""
        try:
            yield
        finally:
            self._send(Commit())

    def _send(self, message: Rows | Commit) -> None:
        try:
            frames.send(self._pipe, self._encode(message))
        except BrokenPipeError:
            self._end()
            raise self._failure or OperationalError(f"the process writing {self.path} stopped reading") from None

    def close(self) -> None:
        """Wait for the writer to commit what it was sent; raise if it failed."""
        self._end()
        if self._failure is not None:
            raise self._failure

    def _end(self) -> None:
        """Close the pipe and wait for the writer (once); keep why it failed."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(BrokenPipeError):
            self._pipe.close()
        assert self._writer.stdout is not None
        said = self._writer.stdout.read().decode(errors="replace").strip()
        status = self._writer.wait()
        if status != 0:
            how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
            self._failure = OperationalError(
                f"the process writing {self.path} ended ({how})" + (f": {said}" if said else "")
                + "; the rows it committed are in the ledger, `tillerman ledger verify` checks them")

