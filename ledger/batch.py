"""Preparing a batch for the chain: what every backend does before it stores rows.

For each offered envelope, in order: an identical duplicate of a stored (or earlier
in the batch) ``event_id`` is a silent no-op; the same id with different content
becomes a ``conflict`` event instead (never an overwrite); an intent event is checked
against the state table, and a move the table does not allow refuses the WHOLE batch
(``IllegalTransition``) before anything is stored. The rest get contiguous seqs and
their chain links. A backend supplies two lookups — stored digests and an intent's
current state — and stores the prepared rows in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import msgspec

from tillerman.ledger import events
from tillerman.ledger.errors import IllegalTransition
from tillerman.ledger.events import Entry, Envelope, IntentEvidence, IntentProposed, IntentTransition
from tillerman.ledger.intent_states import State, check_transition, known_state
from tillerman.ledger.recorder import content_digest, row_hash

# event ids -> stored content digests, or a prefix of each (all a backend keeps)
DigestLookup = Callable[[Iterable[str]], dict[str, str]]
StateLookup = Callable[[str], State | None]  # intent id -> its state in the store, None if absent


class Row(msgspec.Struct, frozen=True):
    seq: int
    envelope: Envelope
    payload: bytes
    digest: str
    prev_hash: str
    hash: str

    @property
    def intent_id(self) -> str | None:
        return intent_id_of(self.envelope.event)

    def entry(self) -> Entry:
        """The row as ``Recorder.read`` yields it."""
        return Entry(seq=self.seq, envelope=self.envelope, prev_hash=self.prev_hash, hash=self.hash)


class Prepared(msgspec.Struct, frozen=True):
    rows: list[Row]
    duplicates: int
    conflicts: tuple[str, ...]
    intent_states: dict[str, State]  # the intents this batch moves, and where to


def prepare(
    batch: Sequence[Envelope], head_seq: int, head_hash: str, observed: float,
    stored_digests: DigestLookup, stored_state: StateLookup,
) -> Prepared:
    known = stored_digests([e.event_id for e in batch])
    states: dict[str, State | None] = {}  # the intents this batch touches: stored, then moved

    rows: list[Row] = []
    conflicts: list[str] = []
    duplicates = 0
    seq, prev = head_seq, head_hash
    pending = list(batch)
    for env in pending:  # conflict records appended below are prepared in turn
        env = stored_times(env, observed)
        payload = _encode_event(env.event)
        digest = content_digest(env, payload)
        if known:
            existing = known.get(env.event_id)
            if existing is not None:
                if digest.startswith(existing):  # a backend may keep only a prefix (chain_only)
                    duplicates += 1
                else:
                    conflicts.append(env.event_id)
                    record = conflict_envelope(env, existing, digest, observed)
                    known.update(stored_digests([record.event_id]))
                    pending.append(record)
                continue
        if type(env.event) in _INTENT_EVENTS:
            _check_intent(env.event, stored_state, states)
        seq += 1
        link = row_hash(prev, seq, env, payload, digest)
        rows.append(Row(seq, env, payload, digest, prev, link))
        known[env.event_id] = digest
        prev = link
    moved = {intent_id: state for intent_id, state in states.items() if state is not None}
    return Prepared(rows, duplicates, tuple(conflicts), moved)


_INTENT_EVENTS = frozenset((IntentProposed, IntentTransition, IntentEvidence))  # final types: no subclasses
_encode_event = events.encode


def none_stored(event_ids: Iterable[str]) -> dict[str, str]:
    """The ``DigestLookup`` of ids the caller knows were never stored."""
    return {}


def stored_times(env: Envelope, observed: float) -> Envelope:
    """``observed_at`` filled in, and a zero time as SQLite reads it back (it stores -0.0
    as 0): digest and hash must be of the times as they read back."""
    if env.observed_at is not None and env.at != 0.0 and env.observed_at != 0.0:
        return env
    if env.observed_at is None:
        env = msgspec.structs.replace(env, observed_at=observed)
    if env.at == 0.0 or env.observed_at == 0.0:
        env = msgspec.structs.replace(env, at=None if env.at is None else env.at + 0.0,
                                      observed_at=env.observed_at + 0.0)
    return env


def _check_intent(event: events.Event, stored_state: StateLookup, states: dict[str, State | None]) -> None:
    """Refuse, before anything is stored, an intent event the table does not allow."""

    def state_of(intent_id: str) -> State | None:
        if intent_id not in states:
            states[intent_id] = stored_state(intent_id)
        return states[intent_id]

    if isinstance(event, IntentProposed):
        if state_of(event.intent.id) is not None:
            raise IllegalTransition(f"intent {event.intent.id} already exists")
        states[event.intent.id] = State.PROPOSED
    elif isinstance(event, IntentTransition):
        current = state_of(event.intent_id)
        if current is None:
            raise IllegalTransition(f"no intent {event.intent_id} to move to {event.to_state}")
        if event.from_state != current:
            raise IllegalTransition(
                f"intent {event.intent_id} is {current}, not {event.from_state}: it moved meanwhile"
            )
        to_state = known_state(event.to_state, event.intent_id)
        check_transition(current, to_state, event.reason)
        states[event.intent_id] = to_state
    elif isinstance(event, IntentEvidence):
        if state_of(event.intent_id) is None:
            raise IllegalTransition(f"no intent {event.intent_id} to record evidence for")


def intent_id_of(event: events.Event) -> str | None:
    """The intent an event is about (for the backends' per-intent lookup)."""
    about = _INTENT_OF.get(type(event))  # a lookup by type: most events are about none
    return None if about is None else about(event)


_INTENT_OF: dict[type, Callable[[events.Event], str]] = {
    IntentProposed: lambda event: event.intent.id,
    IntentTransition: lambda event: event.intent_id,
    IntentEvidence: lambda event: event.intent_id,
    events.DecisionRecorded: lambda event: event.intent_id,
}


def conflict_envelope(env: Envelope, existing: str, offered: str, observed: float) -> Envelope:
    ev = env.event
    return Envelope(
        event_id=f"conflict:{env.event_id}:{offered[:16]}",
        event=events.Conflict(
            thread_id=ev.thread_id, turn_id=ev.turn_id, event_id=env.event_id,
            existing_digest=existing, offered_digest=offered,
        ),
        source=env.source, at=env.at, observed_at=observed,
    )


def row_columns(row: Row) -> tuple:
    """A row in the stored column order (``tillerman.ledger.migrations.EVENT_COLUMNS``;
    ``entry_of`` and ``verify_rows`` read it)."""
    env = row.envelope
    ev = env.event
    return (row.seq, env.event_id, env.at, env.observed_at, env.source, ev.thread_id, ev.turn_id,
            ev.__struct_config__.tag, intent_id_of(ev), env.offset, env.length, row.payload, row.digest,
            row.prev_hash, row.hash)


def entry_of(row: tuple) -> Entry:
    """A stored row (``row_columns``' order, as every backend reads it back) as an entry."""
    (seq, event_id, at, observed_at, source, thread, turn, kind, _intent,
     offset, length, payload, _digest, prev_hash, link) = row
    env = Envelope(
        event_id=event_id, event=events.decode_stored(payload, kind, thread, turn), source=source, at=at,
        observed_at=observed_at, offset=offset, length=length,
    )
    return Entry(seq=seq, envelope=env, prev_hash=prev_hash, hash=link)
