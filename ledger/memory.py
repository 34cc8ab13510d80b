"""A ledger held in the process's memory: the recorder contract (``tillerman.ledger.recorder``)
without SQLite, for runs whose ledger is thrown away at exit and that read their rows
back (``tillerman rules diff``'s replays; ``tillerman replay`` without ``--ledger`` keeps
only the chain head: ``tillerman.ledger.chain_only``).

The same rows as ``tillerman.ledger.sqlite`` — payload, content digest, hash chain — so
``verify`` walks them with the same code (``tillerman.ledger.verify.verify_ledger``) and a
replay records the same entries whichever backend it uses. One process, one writer:
nothing here is shared or durable (``durable`` is accepted and means nothing), and
there is no head anchor to keep.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import msgspec

from tillerman.ledger.batch import Row, prepare, row_columns
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.intent_states import State
from tillerman.ledger.recorder import GENESIS, AppendResult, Recorder, VerifyReport
from tillerman.ledger.verify import verify_ledger


class InProcessExtras:
    """Snapshots and file offsets held in a dict each: what the in-process recorders
    (this one and ``tillerman.ledger.chain_only``) keep besides their rows."""

    def __init__(self) -> None:
        self._snapshots: dict[str, tuple[int, bytes]] = {}
        self._offsets: dict[str, FileOffset] = {}  # file identity -> where it was read up to

    def _keep_offsets(self, offsets: Sequence[FileOffset]) -> None:
        now = time.time()
        self._offsets.update((o.identity, o if o.updated_at else msgspec.structs.replace(o, updated_at=now))
                             for o in offsets)

    def file_offsets(self) -> list[FileOffset]:
        return sorted(self._offsets.values(), key=lambda o: (o.path, o.identity))

    def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        return self._snapshots.get(name)

    def save_snapshot(self, name: str, seq: int, state: bytes) -> None:
        saved = self._snapshots.get(name)
        if saved is None or seq >= saved[0]:
            self._snapshots[name] = (seq, bytes(state))

    def close(self) -> None:
        pass


class MemoryRecorder(InProcessExtras, Recorder):
    def __init__(self) -> None:
        super().__init__()
        self._rows: list[Row] = []  # index = seq - 1
        self._digests: dict[str, str] = {}  # event id -> content digest
        self._intent_rows: dict[str, list[int]] = {}  # intent id -> seqs, in order
        self._intent_states: dict[str, State] = {}

    # -- append -----------------------------------------------------------------

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        if not batch and not offsets:
            return AppendResult()
        head_hash = self._rows[-1].hash if self._rows else GENESIS
        prepared = prepare(  # raises before anything is kept: the batch is atomic
            batch, len(self._rows), head_hash, time.time(),
            lambda ids: {i: self._digests[i] for i in ids if i in self._digests},
            self._intent_states.get,
        )
        for row in prepared.rows:
            self._rows.append(row)
            self._digests[row.envelope.event_id] = row.digest
            if row.intent_id is not None:
                self._intent_rows.setdefault(row.intent_id, []).append(row.seq)
        self._intent_states.update(prepared.intent_states)
        self._keep_offsets(offsets)
        return AppendResult(tuple(row.entry() for row in prepared.rows), prepared.duplicates, prepared.conflicts)

    # -- read -------------------------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        start = max(after_seq, 0)
        stop = len(self._rows) if limit is None else min(len(self._rows), start + max(limit, 0))
        for index in range(start, stop):
            yield self._rows[index].entry()

    def max_seq(self) -> int:
        return len(self._rows)

    def intent_entries(self, intent_id: str) -> list[Entry]:
        return [next(self.read(after_seq=seq - 1, limit=1)) for seq in self._intent_rows.get(intent_id, ())]

    # -- verification -----------------------------------------------------------

    def verify(self) -> VerifyReport:
        return verify_ledger((row_columns(row) for row in self._rows), ["ok"], None,
                             snapshot=self.load_snapshot, entries=self.read)
