"""The fold: turns, tools, approvals, queues and intents from events; snapshots."""

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ledger.recorder_contract import make_intent
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder


def env(i, event, source="file:x", at=None):
    return Envelope(event_id=f"{source}:{i}", event=event, source=source, at=float(i) if at is None else at)


def fold(*evs, source="file:x"):
    rec = SQLiteRecorder()
    rec.append([env(i, e, source) for i, e in enumerate(evs)])
    return projections.load(rec)


def test_turn_lifecycle_and_unclosed_turns():
    p = fold(ev.TurnStarted(thread_id="t", turn_id="a"), ev.TurnStarted(thread_id="t", turn_id="b"),
             ev.TurnCompleted(thread_id="t", turn_id="b", status="interrupted"))
    snap = p.snapshot("t")
    assert snap.turn_states == {"a": "unclosed", "b": "interrupted"}
    assert snap.active_turn_id is None


def test_the_same_turn_from_two_sources_is_one_turn():
    rec = SQLiteRecorder()
    start, end = ev.TurnStarted(thread_id="t", turn_id="a"), ev.TurnCompleted(thread_id="t", turn_id="a")
    rec.append([env(0, start, "appserver:x"), env(0, start, "file:r"), env(1, end, "appserver:x"),
                env(1, end, "file:r"), env(2, start, "file:r2")])  # a lagging copy after the end
    snap = projections.load(rec).snapshot("t")
    assert snap.turn_states == {"a": "completed"} and snap.active_turn_id is None
    assert snap.steerable  # the app-server connection observes it


def test_critical_tool_approval_and_external_effect():
    p = fold(
        ev.TurnStarted(thread_id="t", turn_id="a"),
        ev.ItemStarted(thread_id="t", turn_id="a", item_id="c1", item_type="commandExecution", critical=True, external=True),
        ev.ApprovalRequested(thread_id="t", turn_id="a", item_id="c2"),
    )
    snap = p.snapshot("t")
    assert snap.critical_tool and snap.external_effect_unknown and snap.approval_pending
    assert snap.critical_tool_since == 1.0 and snap.approval_pending_since == 2.0
    # an interrupt ends the turn and the approval, but the command may still run
    p2 = fold(
        ev.TurnStarted(thread_id="t", turn_id="a"),
        ev.ItemStarted(thread_id="t", turn_id="a", item_id="c1", item_type="commandExecution", external=True),
        ev.ApprovalRequested(thread_id="t", turn_id="a", item_id="c2"),
        ev.TurnCompleted(thread_id="t", turn_id="a", status="interrupted"),
    )
    snap2 = p2.snapshot("t")
    assert not snap2.approval_pending and snap2.external_effect_unknown


def test_repeated_failures_count_per_turn():
    fail = ev.ItemCompleted(thread_id="t", turn_id="a", item_id="x", item_type="commandExecution",
                            status="failed", exit_code=2, tool="exec", args_digest="sha256:1")
    p = fold(ev.TurnStarted(thread_id="t", turn_id="a"), fail, fail, fail)
    assert p.snapshot("t").failures == {"sha256:1": (3, "exec", 2)}
    p2 = fold(ev.TurnStarted(thread_id="t", turn_id="a"), fail, ev.TurnStarted(thread_id="t", turn_id="b"))
    assert p2.snapshot("t").failures == {}


def test_queue_paused_after_interrupt_with_entries():
    entries = (ev.QueueEntry(id="q1", client_id="c"),)
    p = fold(ev.TurnStarted(thread_id="t", turn_id="a"), ev.QueueChanged(thread_id="t", entries=entries),
             ev.QueueChanged(thread_id="t", known=False),
             ev.TurnCompleted(thread_id="t", turn_id="a", status="interrupted"))
    snap = p.snapshot("t")
    assert snap.queue == entries and snap.queue_paused


def test_unknown_thread_snapshot():
    assert not Projection().snapshot("nope").known


_EVENTS = st.one_of(
    st.builds(ev.TurnStarted, thread_id=st.sampled_from("tu"), turn_id=st.sampled_from("abc")),
    st.builds(ev.TurnCompleted, thread_id=st.sampled_from("tu"), turn_id=st.sampled_from("abc"),
              status=st.sampled_from(["completed", "interrupted", "failed"])),
    st.builds(ev.ItemStarted, thread_id=st.sampled_from("tu"), turn_id=st.sampled_from("abc"),
              item_id=st.sampled_from("xyz"), item_type=st.just("commandExecution"), critical=st.booleans()),
    st.builds(ev.ItemCompleted, thread_id=st.sampled_from("tu"), turn_id=st.sampled_from("abc"),
              item_id=st.sampled_from("xyz"), item_type=st.just("commandExecution"),
              exit_code=st.sampled_from([0, 1]), args_digest=st.sampled_from(["d1", "d2"])),
    st.builds(ev.ApprovalRequested, thread_id=st.sampled_from("tu"), item_id=st.sampled_from("xyz")),
    st.builds(ev.ApprovalResolved, thread_id=st.sampled_from("tu"), item_id=st.sampled_from("xyz")),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_EVENTS, max_size=30), st.data())
def test_snapshot_plus_tail_equals_a_full_fold(evs, data):
    """A restart that loads a snapshot and folds the tail ends where a full fold does."""
    rec = SQLiteRecorder()
    rec.append([env(i, e) for i, e in enumerate(evs)])
    cut = data.draw(st.integers(0, len(evs)))
    partial = Projection().fold(rec.read(limit=cut))
    projections.save(rec, partial)
    restarted = projections.load(rec)
    full = Projection().fold(rec.read())
    assert restarted == full
    for thread in "tu":
        assert restarted.snapshot(thread) == full.snapshot(thread)


_INTENT_IDS = [f"in-{n:020d}" for n in range(4)]
_INTENT_MOVES = st.one_of(
    st.builds(lambda i, check: ("propose", i, check), st.sampled_from(_INTENT_IDS), st.booleans()),
    st.builds(lambda i, state: ("move", i, state), st.sampled_from(_INTENT_IDS), st.sampled_from(list(State))),
)


@given(st.lists(_INTENT_MOVES, max_size=40))
def test_the_open_intents_kept_are_the_open_ones_among_all(moves):
    """``open_intents`` answers from the ids it keeps as intents move (a round asks every
    time): always the open ones among every intent the fold holds, in proposal order, and
    so again from a saved snapshot. Moves here need not be legal (the fold takes any)."""
    p = Projection()
    for seq, (kind, intent_id, what) in enumerate(moves, 1):
        if kind == "propose":
            intent = msgspec.structs.replace(make_intent(intent_id), verify="tests pass" if what else None)
            event = ev.IntentProposed(thread_id="t1", intent=intent)
        else:
            event = ev.IntentTransition(thread_id="t1", intent_id=intent_id, from_state="proposed", to_state=what,
                                        reason="test")
        p.apply_envelope(Envelope(event_id=f"e{seq}", event=event, source="tillerman", at=float(seq)), seq)
        assert p.open_intents() == [v for v in p.intents.values() if projections.is_open(v)]
    assert projections.decode_state(msgspec.msgpack.encode(p)).open_intents() == p.open_intents()
