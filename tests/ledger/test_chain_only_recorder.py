from pathlib import Path

import msgspec
import pytest

from tests.ledger.recorder_contract import RecorderContract, make_intent, moved, proposed, turn
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.chain_only import UNCHAINED, ChainOnlyRecorder
from tillerman.ledger.errors import IllegalTransition, RowsNotKept
from tillerman.ledger.events import Conflict, Envelope, TurnStarted
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.recorder import GENESIS
from tillerman.rules.config import load_effective

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"


class TestChainOnlyRecorder(RecorderContract):
    def make_recorder(self, tmp_path):
        return ChainOnlyRecorder()


def _batches() -> list[list[Envelope]]:
    intent = make_intent()
    changed = Envelope(event_id="e2", event=TurnStarted(thread_id="t1", turn_id="other"), source="test", at=2.0)
    return [[turn(1), turn(2)], [turn(2), turn(3), changed], [changed, turn(4, thread="t2")],
            [proposed(intent), moved(intent, "proposed", "dispatch_unknown", "dispatching")],
            [proposed(intent)], [moved(intent, "dispatch_unknown", "queued", "accepted")]]


def _same_fact(entry):
    """An entry's envelope, a conflict's stored digest cut to what every backend names of
    it (and its record observed at no particular wall-clock time)."""
    envelope = entry.envelope
    if isinstance(envelope.event, Conflict):
        event = msgspec.structs.replace(envelope.event, existing_digest=envelope.event.existing_digest[:8])
        envelope = msgspec.structs.replace(envelope, event=event, observed_at=None)
    return envelope


def test_appends_return_what_a_ledger_with_rows_returns():
    """The same batches — duplicates, a conflict, intent moves — give the same seqs,
    duplicates, conflicts and entries as the in-memory ledger that keeps its rows; the
    chain differs only past a conflict record, which names the stored content by the
    32-bit prefix kept."""
    chain, rows = ChainOnlyRecorder(), MemoryRecorder()
    assert chain.head == (0, GENESIS)
    for batch in _batches():
        batch = [msgspec.structs.replace(e, observed_at=1.0) for e in batch]
        a, b = chain.append(batch), rows.append(batch)
        assert (a.seqs, a.duplicates, a.conflicts) == (b.seqs, b.duplicates, b.conflicts)
        assert [_same_fact(e) for e in a.entries] == [_same_fact(e) for e in b.entries]
    assert chain.max_seq() == rows.max_seq() == chain.head[0] == 8


def test_without_conflicts_the_head_is_the_chain_of_a_ledger_with_rows():
    chain, rows = ChainOnlyRecorder(), MemoryRecorder()
    for batch in ([turn(1), turn(2)], [turn(2), turn(3)], [turn(4, thread="t2")]):
        batch = [msgspec.structs.replace(e, observed_at=1.0) for e in batch]
        assert chain.append(batch) == rows.append(batch)
    last = list(rows.read())[-1]
    assert chain.head == (last.seq, last.hash)


def test_rows_read_once_are_numbered_as_appended_but_not_chained():
    """``append_new``: the seqs and envelopes ``append`` gives, links ``UNCHAINED`` and
    no id kept; what is appended after chains on, and ``verify`` says the head is no
    chain head."""
    chain, rows = ChainOnlyRecorder(), MemoryRecorder()
    observations = [msgspec.structs.replace(turn(i), observed_at=None if i == 2 else 1.0) for i in (1, 2, 3)]
    numbered, appended = chain.append_new(observations), rows.append(observations)
    assert [(e.seq, e.envelope.event_id, e.envelope.event) for e in numbered.entries] == \
        [(e.seq, e.envelope.event_id, e.envelope.event) for e in appended.entries]
    assert numbered.entries[1].envelope.observed_at is not None  # filled in, as every backend does
    assert {(e.prev_hash, e.hash) for e in numbered.entries} == {(UNCHAINED, UNCHAINED)}
    assert chain.head == (3, UNCHAINED) and chain.ids_kept() == 0
    assert chain.verify().notes == ("rows not kept, 3 of them numbered without a chain; head at seq 3: unchained",)
    (decision,) = chain.append([turn(4)]).entries
    assert (decision.seq, decision.prev_hash) == (4, UNCHAINED) and decision.hash != UNCHAINED
    assert chain.head == (4, decision.hash) and f"head at seq 4: {decision.hash}" in chain.verify().notes[0]


def test_a_repeated_proposal_is_refused_as_by_every_backend():
    rec = ChainOnlyRecorder()
    intent = make_intent()
    rec.append([proposed(intent), moved(intent, "proposed", "expired", "cancelled")])
    again = msgspec.structs.replace(proposed(intent), event_id="other-id")
    with pytest.raises(IllegalTransition, match="already exists"):
        rec.append([again])


def test_rows_it_did_not_keep_cannot_be_read():
    rec = ChainOnlyRecorder()
    rec.append([turn(1)])
    assert rec.retains_rows is False and MemoryRecorder.retains_rows is True
    with pytest.raises(RowsNotKept):
        list(rec.read())
    with pytest.raises(RowsNotKept):
        rec.intent_entries("in-1")
    report = rec.verify()
    assert report.ok and report.last_seq == 1 and "rows not kept" in report.notes[0]


def test_replay_through_it_summarises_as_through_a_ledger_with_rows():
    """``tillerman replay`` without ``--ledger``: the same summary (decisions digest,
    intents, overdue) as a replay into a ledger that keeps its rows."""
    ruleset = load_effective(None, None).ruleset
    sessions = [str(SESSIONS)]
    assert Replayer(ChainOnlyRecorder(), ruleset).run(sessions) == Replayer(MemoryRecorder(), ruleset).run(sessions)
