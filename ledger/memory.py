"""A ledger held in the process's memory: the recorder contract (``ledger.recorder``)
without SQLite, for runs whose ledger is thrown away at exit (``tillerman replay``
without ``--ledger``).

The same rows as ``ledger.sqlite`` — payload, content digest, hash chain — so
``verify`` walks them with the same code (``ledger.verify.verify_rows``) and a
replay records the same entries whichever backend it uses. One process, one writer:
nothing here is shared or durable (``durable`` is accepted and means nothing), and
there is no head anchor to keep.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from ledger import events
from ledger.errors import IllegalTransition
from ledger.events import Entry, Envelope, IntentEvidence, IntentProposed, IntentTransition
from ledger.intent_states import State, check_transition
from ledger.recorder import (
    GENESIS,
    AppendResult,
    Recorder,
    VerifyReport,
    content_digest,
    encode_payload,
    row_hash,
)
from ledger.sqlite import _conflict, _intent_id, _with_observed


class MemoryRecorder(Recorder):
    def __init__(self) -> None:
        self._entries: list[Entry] = []  # index = seq - 1
        self._payloads: list[bytes] = []
        self._digests: dict[str, str] = {}  # event id -> content digest
        self._intent_rows: dict[str, list[int]] = {}  # intent id -> seqs, in order
        self._intent_states: dict[str, State] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}
        self._closed = False

    # -- append -----------------------------------------------------------------

    def append(self, batch: Sequence[Envelope], *, durable: bool = False) -> AppendResult:
        if not batch:
            return AppendResult()
        observed = time.time()
        seq = len(self._entries)
        prev = self._entries[-1].hash if self._entries else GENESIS
        known: dict[str, str] = {}  # written by this batch, not yet committed
        states: dict[str, State | None] = {}
        rows: list[tuple[Entry, bytes, str]] = []
        seqs, conflicts, duplicates = [], [], 0
        pending = list(batch)
        i = 0
        while i < len(pending):  # everything checked before anything is kept: atomic
            env = pending[i]
            i += 1
            if env.observed_at is None:
                env = _with_observed(env, observed)
            payload = encode_payload(env)
            digest = content_digest(env, payload)
            existing = known.get(env.event_id) or self._digests.get(env.event_id)
            if existing is not None:
                if existing == digest:
                    duplicates += 1
                else:
                    conflicts.append(env.event_id)
                    pending.append(_conflict(env, existing, digest, observed))
                continue
            self._check_intent(env.event, states)
            seq += 1
            link = row_hash(prev, seq, env, payload, digest)
            rows.append((Entry(seq=seq, envelope=env, prev_hash=prev, hash=link), payload, digest))
            known[env.event_id] = digest
            seqs.append(seq)
            prev = link
        for entry, payload, digest in rows:
            self._entries.append(entry)
            self._payloads.append(payload)
            self._digests[entry.envelope.event_id] = digest
            intent_id = _intent_id(entry.envelope.event)
            if intent_id is not None:
                self._intent_rows.setdefault(intent_id, []).append(entry.seq)
        for intent_id, state in states.items():
            if state is not None:
                self._intent_states[intent_id] = state
        return AppendResult(tuple(seqs), duplicates, tuple(conflicts))

    def _check_intent(self, event: events.Event, states: dict[str, State | None]) -> None:
        """The same refusals as ``SQLiteRecorder._check_intent``, before anything is kept."""
        if isinstance(event, IntentProposed):
            if self._state(event.intent.id, states) is not None:
                raise IllegalTransition(f"intent {event.intent.id} already exists")
            states[event.intent.id] = State.PROPOSED
        elif isinstance(event, IntentTransition):
            current = self._state(event.intent_id, states)
            if current is None:
                raise IllegalTransition(f"no intent {event.intent_id} to move to {event.to_state}")
            if event.from_state != current:
                raise IllegalTransition(
                    f"intent {event.intent_id} is {current}, not {event.from_state}: it moved meanwhile"
                )
            check_transition(current, State(event.to_state), event.reason)
            states[event.intent_id] = State(event.to_state)
        elif isinstance(event, IntentEvidence):
            if self._state(event.intent_id, states) is None:
                raise IllegalTransition(f"no intent {event.intent_id} to record evidence for")

    def _state(self, intent_id: str, states: dict[str, State | None]) -> State | None:
        if intent_id in states:
            return states[intent_id]
        return self._intent_states.get(intent_id)

    # -- read -------------------------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        start = max(after_seq, 0)
        stop = len(self._entries) if limit is None else min(len(self._entries), start + max(limit, 0))
        for index in range(start, stop):
            yield self._entries[index]

    def max_seq(self) -> int:
        return len(self._entries)

    def intent_entries(self, intent_id: str) -> list[Entry]:
        return [self._entries[seq - 1] for seq in self._intent_rows.get(intent_id, ())]

    # -- snapshots --------------------------------------------------------------

    def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        return self._snapshots.get(name)

    def save_snapshot(self, name: str, seq: int, state: bytes) -> None:
        saved = self._snapshots.get(name)
        if saved is None or seq >= saved[0]:
            self._snapshots[name] = (seq, bytes(state))

    # -- verification -----------------------------------------------------------

    def verify(self) -> VerifyReport:
        from ledger.verify import verify_rows

        return verify_rows(self._rows(), ["ok"], None)

    def _rows(self) -> Iterator[tuple]:
        """The rows as ``ledger.sqlite`` stores them (its column order)."""
        for entry, payload in zip(self._entries, self._payloads, strict=True):
            env = entry.envelope
            ev = env.event
            yield (entry.seq, env.event_id, env.at, env.observed_at, env.source, ev.thread_id, ev.turn_id,
                   events.kind_of(ev), _intent_id(ev), env.offset, env.length, payload,
                   self._digests[env.event_id], entry.prev_hash, entry.hash)

    def close(self) -> None:
        self._closed = True

