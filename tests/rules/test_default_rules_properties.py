"""The built-in rules never steer or interrupt during an approval wait or a critical
tool: whatever they find, and even with every grant in place, the policy holds it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.intent_states import State
from ledger.intents import Intent, text_digest
from ledger.snapshot import ThreadSnapshot
from rules.decision import Action
from rules.detect import detect
from rules.files import default_ruleset
from rules.policy import decide
from rules.ruleset import Grant, build_ruleset

DEFAULTS = default_ruleset()
# every default rule may steer, queue and interrupt, even through a critical tool
GRANTED = build_ruleset(DEFAULTS.rules, tuple(
    Grant(subject=f"rule:{rule.id}", actions=frozenset({"steer", "queue", "interrupt", "interrupt_critical"}))
    for rule in DEFAULTS.rules))
T0 = 1_800_000_000.0

hazardous = st.builds(
    ThreadSnapshot,
    thread_id=st.just("t"),
    steerable=st.just(True),
    active_turn_id=st.just("u"),
    active_turn_started_at=st.floats(T0 - 86400, T0),
    turn_states=st.just({"u": "active"}),
    last_progress_at=st.none() | st.floats(T0 - 86400, T0),
    approval_pending=st.booleans(),
    approval_pending_since=st.floats(T0 - 86400, T0),
    critical_tool=st.booleans(),
    critical_tool_since=st.floats(T0 - 86400, T0),
    external_effect_unknown=st.booleans(),
    failures=st.dictionaries(st.sampled_from(["sha256:a", "sha256:b"]),
                             st.tuples(st.integers(0, 9), st.sampled_from(["exec", None]), st.integers(0, 2)),
                             max_size=2),
).filter(lambda s: s.approval_pending or s.critical_tool)


@settings(max_examples=300, deadline=None)
@given(hazardous, st.floats(0, 86400), st.booleans())
def test_defaults_never_steer_or_interrupt_during_an_approval_or_a_critical_tool(snapshot, later, force):
    now = T0 + later
    for finding in detect(snapshot, now, GRANTED):
        mode = finding.action.value if finding.action in (Action.STEER, Action.QUEUE, Action.INTERRUPT) else "interrupt"
        intent = Intent(id="in-00000000000000000001", thread_id="t", mode=mode, text="x", text_digest=text_digest("x"),
                        created_at=now, ack_deadline=now + 60, expires_at=now + 600, expected_turn_id="u",
                        producer=f"rule:{finding.rule_id}", rule_id=finding.rule_id,
                        rule_version=finding.rule_version, force=force and not snapshot.approval_pending)
        decision = decide(intent, State.PROPOSED, snapshot, now, GRANTED)
        if snapshot.approval_pending or not (intent.force and mode == "interrupt"):
            assert decision.action not in (Action.STEER, Action.INTERRUPT, Action.QUEUE), (finding, decision)
        assert finding.action not in (Action.INTERRUPT,)  # no default rule ever asks to interrupt
