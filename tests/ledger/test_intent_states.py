"""Walk every row of the intent table, and try every move outside it."""

import itertools

import pytest

from tests.ledger.recorder_contract import make_intent, moved, proposed
from tillerman.ledger.errors import IllegalTransition
from tillerman.ledger.intent_states import TRANSITIONS, State, check_transition, is_terminal
from tillerman.ledger.sqlite import SQLiteRecorder

# the shortest legal path from proposed to each state, used to set up a walk
_PATH_TO = {
    State.PROPOSED: [],
    State.DISPATCH_UNKNOWN: [(State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching")],
    State.QUEUED: [(State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                   (State.DISPATCH_UNKNOWN, State.QUEUED, "accepted")],
    State.ACKNOWLEDGED: [(State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                         (State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "echo")],
    State.ACTION_STARTED: [(State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching"),
                           (State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "echo"),
                           (State.ACKNOWLEDGED, State.ACTION_STARTED, "expect_matched")],
}
_PATH_TO[State.EFFECT_VERIFIED] = _PATH_TO[State.ACKNOWLEDGED] + [(State.ACKNOWLEDGED, State.EFFECT_VERIFIED, "verify_passed")]
_PATH_TO[State.EFFECT_FAILED] = _PATH_TO[State.ACKNOWLEDGED] + [(State.ACKNOWLEDGED, State.EFFECT_FAILED, "verify_failed")]
_PATH_TO[State.EXPIRED] = [(State.PROPOSED, State.EXPIRED, "cancelled")]
_PATH_TO[State.REJECTED] = [(State.PROPOSED, State.REJECTED, "no_grant")]


def _ledger_at(state: State):
    rec = SQLiteRecorder()
    intent = make_intent()
    rec.append([proposed(intent)] + [moved(intent, a, b, r) for a, b, r in _PATH_TO[state]])
    return rec, intent


@pytest.mark.parametrize(("move", "reasons"), sorted(TRANSITIONS.items()))
def test_every_legal_row_is_accepted_by_the_ledger(move, reasons):
    frm, to = move
    for reason in sorted(reasons):
        rec, intent = _ledger_at(frm)
        assert rec.append([moved(intent, frm, to, reason)]).seqs
        assert rec.verify().ok


OUTSIDE = [(a, b) for a, b in itertools.product(State, State) if (a, b) not in TRANSITIONS]


@pytest.mark.parametrize(("frm", "to"), OUTSIDE)
def test_every_move_outside_the_table_is_refused_and_writes_nothing(frm, to):
    rec, intent = _ledger_at(frm)
    before = rec.max_seq()
    with pytest.raises(IllegalTransition):
        rec.append([moved(intent, frm, to, "echo")])
    assert rec.max_seq() == before


def test_a_legal_move_with_a_foreign_reason_is_refused():
    with pytest.raises(IllegalTransition, match="needs one of the reasons"):
        check_transition(State.PROPOSED, State.EXPIRED, "because")


def test_refusal_names_the_legal_next_states():
    with pytest.raises(IllegalTransition, match="legal next states: dispatch_unknown, expired, rejected"):
        check_transition(State.PROPOSED, State.QUEUED, "accepted")
    with pytest.raises(IllegalTransition, match="rejected is terminal"):
        check_transition(State.REJECTED, State.QUEUED, "accepted")


def test_acknowledged_is_terminal_only_without_a_check():
    plain = make_intent()
    checked = make_intent().__class__(**{**{f: getattr(plain, f) for f in plain.__struct_fields__}, "verify": "test -f x"})
    assert is_terminal(State.ACKNOWLEDGED, plain)
    assert not is_terminal(State.ACKNOWLEDGED, checked)
    for state in (State.EFFECT_VERIFIED, State.EFFECT_FAILED, State.EXPIRED, State.REJECTED):
        assert is_terminal(state, checked)
    for state in (State.PROPOSED, State.DISPATCH_UNKNOWN, State.QUEUED, State.ACTION_STARTED):
        assert not is_terminal(state, plain)


def test_the_table_is_the_design_table():
    """Every state but the terminal ones has a way out; nothing leads back to proposed."""
    sources = {a for a, _ in TRANSITIONS}
    assert sources == {State.PROPOSED, State.DISPATCH_UNKNOWN, State.QUEUED, State.ACKNOWLEDGED, State.ACTION_STARTED}
    assert all(b is not State.PROPOSED for _, b in TRANSITIONS)
