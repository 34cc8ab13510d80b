"""A ledger that keeps its head (last seq and link) and what de-duplication needs, not
its rows: the recorder for a replay whose ledger is thrown away at exit (``tillerman
replay`` without ``--ledger``), so a replay's memory does not grow with the events it
records.

``append`` works as in every backend (``tillerman.ledger.batch.prepare``: the same seqs,
chain links and returned entries as ``tillerman.ledger.memory`` for the same batches) and
keeps, per event id, only a 32-bit prefix of its content digest, and per intent its
state, in a compact table (``tillerman.ledger.id_table``, about 14 bytes a name). That
is enough to tell an identical duplicate (dropped) from a changed one (a conflict
record); a conflict record names the stored content by the prefix kept, where a backend
with rows names the whole digest. Rows it did not keep cannot be read: ``read`` and
``intent_entries`` raise ``RowsNotKept``, and ``verify`` reports the head it holds.

Events its caller knows are new and will never be offered again are appended with
``append_new``, which keeps no id for them (a replay of many session files, each read
once, keeps ids only for what it records itself) and numbers them without chaining them:
nothing of such a row is kept, shown or read back, so no link of its could ever be
checked, and computing the links (a canonical encoding and two SHA-256 per event) was a
third of an in-memory replay's own work. The head's link is then ``UNCHAINED``, until a
row appended after them is chained on it, and ``verify`` counts the rows numbered so.
``tillerman.ledger.load``, which writes those rows, chains them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from tillerman.ledger.batch import Prepared, prepare, stored_times
from tillerman.ledger.errors import RowsNotKept
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.memory import InProcessExtras
from tillerman.ledger.id_table import IdTable, key_of
from tillerman.ledger.intent_states import State
from tillerman.ledger.recorder import GENESIS, AppendResult, Recorder, VerifyReport

DIGEST_PREFIX = 8  # hex digits of each event's content digest kept: 32 bits
UNCHAINED = ""  # the link of a row numbered without a chain (``append_new``), and the head's after one
_STATES = tuple(State)


class ChainOnlyRecorder(InProcessExtras, Recorder):
    retains_rows = False
    forgets_new_ids = True  # ``append_new`` keeps no id
    chains_new = False  # ``append_new`` numbers rows without chaining them

    def __init__(self) -> None:
        super().__init__()
        self._seq = 0
        self._head = GENESIS
        self._unchained = 0  # rows ``append_new`` numbered
        self._event_digests = IdTable()  # event id -> the first 32 bits of its content digest
        self._intent_states = IdTable()  # intent id -> its state's index in State
        self._absent: dict[str, bytes] = {}  # the ids of the batch being prepared not in the table: their keys

    @property
    def head(self) -> tuple[int, str]:
        """The last seq and its chain hash (``GENESIS`` before any, ``UNCHAINED`` once
        ``append_new`` numbered rows without a chain)."""
        return self._seq, self._head

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        if not batch and not offsets:
            return AppendResult()
        self._absent.clear()
        prepared = prepare(batch, self._seq, self._head, time.time(), self._digests, self._state)
        for row in prepared.rows:  # each was looked up by ``_digests`` and found absent
            self._event_digests.add_key(self._absent[row.envelope.event_id], self._tag(row.digest))
        return self._appended(prepared, offsets)

    def _tag(self, digest: str) -> int:
        """What the table keeps of a stored row's content digest: its first 32 bits."""
        return int(digest[:DIGEST_PREFIX], 16)

    def _kept_digest(self, tag: int) -> str:
        """The digest (or the prefix of it) a ``_tag`` stands for."""
        return f"{tag:0{DIGEST_PREFIX}x}"

    def append_new(self, batch: Sequence[Envelope]) -> AppendResult:
        """``append`` of events the caller knows were never appended and will never be
        offered again: the same rows and entries, but their ids are neither looked up
        nor kept. A replay that reads each session file once and no ledger (whose rows
        repeat the ids of the files it followed) appends their observations here: their
        ids name the file (``file_event_id``), so the table would only grow with them.
        The rows are numbered, not chained (see the module): each entry's links are
        ``UNCHAINED``, and so is the head's hash from now on."""
        if not batch:
            return AppendResult()
        observed, first = time.time(), self._seq + 1
        entries = tuple(Entry(seq=seq, envelope=stored_times(env, observed), prev_hash=UNCHAINED, hash=UNCHAINED)
                        for seq, env in enumerate(batch, first))
        self._seq, self._head = entries[-1].seq, UNCHAINED
        self._unchained += len(entries)
        return AppendResult(entries)

    def _appended(self, prepared: Prepared, offsets: Sequence[FileOffset]) -> AppendResult:
        for intent_id, state in prepared.intent_states.items():
            self._intent_states.put(intent_id, _STATES.index(state))
        if prepared.rows:
            self._seq, self._head = prepared.rows[-1].seq, prepared.rows[-1].hash
        self._keep_offsets(offsets)
        return AppendResult(tuple(row.entry() for row in prepared.rows), prepared.duplicates, prepared.conflicts)

    def ids_kept(self) -> int:
        """Event ids the de-duplication table holds."""
        return len(self._event_digests)

    def _digests(self, event_ids: Iterable[str]) -> dict[str, str]:
        found = {}
        for event_id in event_ids:
            key = key_of(event_id)
            tag = self._event_digests.get_key(key)
            if tag is None:
                self._absent[event_id] = key  # kept for the row it becomes: one digest and search per id
            else:
                found[event_id] = self._kept_digest(tag)
        return found

    def _state(self, intent_id: str) -> State | None:
        index = self._intent_states.get(intent_id)
        return None if index is None else _STATES[index]

    # -- what cannot be read back -------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        raise RowsNotKept("this ledger keeps its chain head, not its rows: record into a ledger file to read them")

    def intent_entries(self, intent_id: str) -> list[Entry]:
        raise RowsNotKept("this ledger keeps its chain head, not its rows: record into a ledger file to read them")

    def max_seq(self) -> int:
        return self._seq

    def verify(self) -> VerifyReport:
        unchained = f", {self._unchained} of them numbered without a chain" if self._unchained else ""
        return VerifyReport(ok=True, rows=self._seq, last_seq=self._seq,
                            notes=(f"rows not kept{unchained}; head at seq {self._seq}: {self._head or 'unchained'}",))
