"""The built-in rules never steer or interrupt during an approval wait or a critical
tool: whatever they find, and even with every grant in place, the policy holds it.
And as ``tillerman run`` builds them with no config file, nothing they find is ever
dispatched: the owner's built-in grant is the owner's, not a rule's."""

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.config import load_effective
from tillerman.rules.decision import DISPATCH_ACTIONS, Action
from tillerman.rules.detect import detect
from tillerman.rules.files import default_ruleset
from tillerman.rules.owner import owner_grant
from tillerman.rules.policy import decide
from tillerman.rules.ruleset import Grant, build_ruleset

DEFAULTS = default_ruleset()
# every default rule may steer, queue and interrupt, even through a critical tool;
# and the owner holds the built-in grant
GRANTED = build_ruleset(DEFAULTS.rules, (owner_grant(), *(
    Grant(subject=f"rule:{rule.id}", actions=frozenset({"steer", "queue", "interrupt", "interrupt_critical"}))
    for rule in DEFAULTS.rules)))
#: What ``tillerman run`` decides with when no config file exists.
UNCONFIGURED = load_effective(None, None).ruleset
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


def rule_intent(finding, now: float, force: bool) -> Intent:
    """The intent a finding would become (an interrupt when the finding only reports)."""
    mode = finding.action.value if finding.action in (Action.STEER, Action.QUEUE, Action.INTERRUPT) else "interrupt"
    return Intent(id="in-00000000000000000001", thread_id="t", mode=mode, text="x", text_digest=text_digest("x"),
                  created_at=now, ack_deadline=now + 60, expires_at=now + 600, expected_turn_id="u",
                  producer=f"rule:{finding.rule_id}", rule_id=finding.rule_id,
                  rule_version=finding.rule_version, force=force)


@settings(max_examples=300, deadline=None)
@given(hazardous, st.floats(0, 86400), st.booleans())
def test_defaults_never_steer_or_interrupt_during_an_approval_or_a_critical_tool(snapshot, later, force):
    now = T0 + later
    for finding in detect(snapshot, now, GRANTED):
        intent = rule_intent(finding, now, force and not snapshot.approval_pending)
        mode = intent.mode
        decision = decide(intent, State.PROPOSED, snapshot, now, GRANTED)
        if snapshot.approval_pending or not (intent.force and mode == "interrupt"):
            assert decision.action not in (Action.STEER, Action.INTERRUPT, Action.QUEUE), (finding, decision)
        assert finding.action not in (Action.INTERRUPT,)  # no default rule ever asks to interrupt


@settings(max_examples=300, deadline=None)
@given(hazardous | hazardous.map(lambda s: replace(s, approval_pending=False, critical_tool=False,
                                                  external_effect_unknown=False)),
       st.floats(0, 86400), st.booleans())
def test_with_no_config_nothing_the_defaults_find_is_dispatched(snapshot, later, force):
    """Whatever the built-in rules find, with no config file their intents are refused
    (no_grant) or held: the owner's built-in grant never lends itself to a rule."""
    now = T0 + later
    for finding in detect(snapshot, now, UNCONFIGURED):
        for mode in ("steer", "queue", "interrupt"):
            intent = replace(rule_intent(finding, now, force), mode=mode)
            decision = decide(intent, State.PROPOSED, snapshot, now, UNCONFIGURED)
            assert decision.action not in DISPATCH_ACTIONS, (finding, decision)
            if not (snapshot.approval_pending or snapshot.critical_tool or snapshot.external_effect_unknown):
                assert (decision.action, decision.reason) == (Action.ESCALATE, "no_grant"), (finding, decision)
