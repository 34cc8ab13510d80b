"""Invariants of ``tillerman.rules.policy.decide`` over arbitrary inputs (hypothesis).

Each invariant is a plain function of a ``decide`` and its inputs, so it can be run
against the real policy and, to show that it can fail, against a deliberately broken
one (a guard monkeypatched away, or a wrapper with a typical bug).
"""

from __future__ import annotations

import copy
import datetime
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from fixtures.rule_texts import NO_OWNER_GRANT
from tests.rules.test_policy_table import CASES, case_inputs
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import MODES, Intent
from tillerman.ledger.snapshot import ENDED_TURN_STATES, TURN_STATES, ThreadSnapshot
from tillerman.rules import policy
from tillerman.rules.decision import DISPATCH_ACTIONS, Action, Decision
from tillerman.rules.files import load_config
from tillerman.rules.owner import owner_grant
from tillerman.rules.policy import FORCEABLE_MODES, decide, producing_rule
from tillerman.rules.ruleset import (
    ANY,
    GRANTABLE_ACTIONS,
    INTERRUPT_CRITICAL,
    RULE_STATUSES,
    Grant,
    RepeatedFailure,
    Rule,
    RuleSet,
    build_ruleset,
)
from tillerman.rules.schema import NO_CONFIG

Inputs = tuple[Intent, State, ThreadSnapshot, float, RuleSet]
Decide = Callable[[Intent, State, ThreadSnapshot, float, RuleSet], Decision]

# Small alphabets, so that ids collide often: equal and unequal turns, matching and
# other threads, granted and ungranted subjects all come up.
THREADS = ("t1", "t2")
TURNS = ("u1", "u2", "u3")
RULE_IDS = ("stall", "repeated-failure")
SUBJECTS = ("owner:ann", "reviewer:rex", *(f"rule:{r}" for r in RULE_IDS))


def mostly(value: bool) -> st.SearchStrategy[bool]:
    """``value`` three times in four: hazards rare enough that dispatch paths run."""
    return st.sampled_from([value, value, value, not value])


# Strategies are built once, here: building them inside a composite on every draw
# costs more than the policy itself.
small_times = st.integers(0, 1000).map(float)
# Mostly comparable moments; now and then any float at all (nan, inf, -0.0).
times = st.one_of(small_times, small_times, small_times, st.floats())
optional_times = st.none() | times
states = st.sampled_from(State)
turns = st.none() | st.sampled_from(TURNS)
turn_states = st.dictionaries(st.sampled_from(TURNS), st.sampled_from(TURN_STATES))
action_sets = st.frozensets(st.sampled_from(GRANTABLE_ACTIONS))

intents = st.builds(
    Intent,
    id=st.just("in-1"),
    thread_id=st.sampled_from(THREADS),
    mode=st.sampled_from(MODES),
    text=st.just("Stop the broad search; inspect src/rules instead."),
    text_digest=st.just("sha256:0"),
    created_at=st.just(0.0),
    ack_deadline=times,
    expires_at=times,
    expected_turn_id=turns,
    effect_deadline=optional_times,
    owner=st.none() | st.just("ann"),
    producer=st.sampled_from((*SUBJECTS, "nobody")),
    rule_version=st.none() | st.integers(1, 3),
    expect=st.none() | st.just("command touches src/rules"),
    verify=st.none() | st.just("test -f done"),
    force=st.booleans(),
    replayed=mostly(False),
)
snapshots = st.builds(
    ThreadSnapshot,
    thread_id=st.sampled_from(THREADS),
    known=mostly(True),
    steerable=mostly(True),
    active_turn_id=turns,
    turn_states=turn_states,
    approval_pending=mostly(False),
    critical_tool=mostly(False),
    external_effect_unknown=mostly(False),
)
grants = st.builds(
    Grant,
    subject=st.sampled_from((*SUBJECTS, ANY)),
    actions=st.frozensets(st.sampled_from(GRANTABLE_ACTIONS), min_size=1),
    threads=st.sampled_from(THREADS + (ANY,)) | st.lists(st.sampled_from(THREADS), max_size=2).map(tuple),
) | st.just(owner_grant("ann"))  # the built-in grant, as if Ann ran tillerman
rules = st.builds(
    Rule,
    id=st.sampled_from(RULE_IDS),
    version=st.integers(1, 3),
    status=st.sampled_from(RULE_STATUSES),
    condition=st.just(RepeatedFailure(count=3)),
    action=st.just(Action.STEER),
    owner=st.just("test"),
    review_by=st.just(datetime.date(2027, 1, 1)),
    text=st.just("Stop re-running {tool}."),
    expires=st.none() | st.dates(),
)
rule_lists = st.lists(rules, max_size=3)
grant_lists = st.lists(grants, max_size=4)


arbitrary_inputs = st.tuples(
    intents, states, snapshots, times, st.builds(build_ruleset, rule_lists, grant_lists)
)
#: One chance in five: how often ``near_dispatch`` replaces a good value by an arbitrary one.
seldom = st.sampled_from([True, False, False, False, False])


@st.composite
def near_dispatch(draw: st.DrawFn) -> Inputs:
    """Inputs that would dispatch, each field spoilt now and then by an arbitrary
    value: one spoilt guard at a time is what shows whether that guard holds."""

    def good_or_any(good: Any, anything: st.SearchStrategy[Any]) -> Any:
        return draw(anything) if draw(seldom) else good

    intent, now = draw(intents), draw(small_times)
    expected = good_or_any(draw(st.sampled_from(TURNS)), turns)
    intent = replace(
        intent,
        expected_turn_id=expected,
        expires_at=good_or_any(now + 100, times),
        replayed=good_or_any(False, st.booleans()),
    )
    snapshot = ThreadSnapshot(
        thread_id=good_or_any(intent.thread_id, st.sampled_from(THREADS)),
        known=good_or_any(True, st.booleans()),
        steerable=good_or_any(True, st.booleans()),
        active_turn_id=good_or_any(expected, turns),
        turn_states=good_or_any({expected: "active"} if expected else {}, turn_states),
        approval_pending=good_or_any(False, st.booleans()),
        critical_tool=good_or_any(False, st.booleans()),
        external_effect_unknown=good_or_any(False, st.booleans()),
    )
    granted = frozenset({intent.mode}) | draw(action_sets)
    grant_list = draw(grant_lists) + good_or_any([Grant(subject=intent.producer, actions=granted, threads=ANY)], grant_lists)
    rule_id, rule_version = producing_rule(intent)
    rule_list = draw(rule_lists)
    if rule_id is not None:
        own_rule = replace(draw(rules), id=rule_id, version=rule_version or 1, status="active", expires=None)
        rule_list = good_or_any([own_rule], rule_lists) + rule_list
    state = good_or_any(State.PROPOSED, states)
    return intent, state, snapshot, now, build_ruleset(rule_list, grant_list)


inputs = st.one_of(arbitrary_inputs, near_dispatch())


# -- the invariants ---------------------------------------------------------------------


def targets_only_the_expected_turn(decide: Decide, args: Inputs) -> None:
    intent, _, snapshot, _, _ = args
    if decide(*args).action in (Action.STEER, Action.INTERRUPT):
        assert snapshot.thread_id == intent.thread_id, "dispatched on a snapshot of another thread"
        assert intent.expected_turn_id is not None, "steered or interrupted without an expected turn"
        assert snapshot.active_turn_id == intent.expected_turn_id, "steered or interrupted a turn other than the expected one"
        assert snapshot.turn_state(intent.expected_turn_id) not in ENDED_TURN_STATES, "targeted a turn that ended"


def never_dispatches_into_a_hazard(decide: Decide, args: Inputs) -> None:
    intent, _, snapshot, _, ruleset = args
    if decide(*args).action in DISPATCH_ACTIONS:
        assert not snapshot.approval_pending, "dispatched while an approval is pending"
        assert not snapshot.external_effect_unknown, "dispatched while an external effect is unknown"
        if snapshot.critical_tool:
            assert intent.mode in FORCEABLE_MODES and intent.force, "dispatched during a critical tool without force"
            assert ruleset.allows(intent.producer, INTERRUPT_CRITICAL, intent.thread_id), (
                "forced an interrupt through a critical tool without interrupt_critical"
            )


def never_dispatches_without_a_grant(decide: Decide, args: Inputs) -> None:
    intent, _, _, _, ruleset = args
    action = decide(*args).action
    if action in DISPATCH_ACTIONS:
        assert ruleset.allows(intent.producer, action, intent.thread_id), "dispatched without a grant"


def never_dispatches_a_replayed_intent(decide: Decide, args: Inputs) -> None:
    if decide(*args).action in DISPATCH_ACTIONS:
        assert not args[0].replayed, "dispatched a replayed intent"


def never_dispatches_for_an_inactive_rule(decide: Decide, args: Inputs) -> None:
    intent, _, _, now, ruleset = args
    rule_id, _ = producing_rule(intent)
    if rule_id is not None and decide(*args).action in DISPATCH_ACTIONS:
        rule = ruleset.rule(rule_id)
        assert rule is not None and rule.status == "active" and rule.in_force(now), "dispatched for a rule not in force"


def dispatch_unknown_always_reconciles(decide: Decide, args: Inputs) -> None:
    if args[1] is State.DISPATCH_UNKNOWN:
        assert decide(*args).action is Action.RECONCILE, "dispatch_unknown did not reconcile"


def only_proposed_intents_dispatch(decide: Decide, args: Inputs) -> None:
    if decide(*args).action in DISPATCH_ACTIONS:
        assert args[1] is State.PROPOSED, "sent an intent again after dispatch began"


def dispatches_in_the_intents_mode(decide: Decide, args: Inputs) -> None:
    action = decide(*args).action
    if action in DISPATCH_ACTIONS:
        assert action == args[0].mode, "dispatched in a mode other than the intent's"


def names_the_producing_rule(decide: Decide, args: Inputs) -> None:
    decision = decide(*args)
    assert (decision.rule_id, decision.rule_version) == producing_rule(args[0]), "decision names the wrong rule"


def is_deterministic(decide: Decide, args: Inputs) -> None:
    first = decide(*args)
    assert decide(*args) == first, "same inputs, different decision"
    assert decide(*copy.deepcopy(args)) == first, "equal inputs, different decision"


def is_total(decide: Decide, args: Inputs) -> None:
    try:
        decision = decide(*args)
    except Exception as exc:  # the property is precisely that nothing escapes
        raise AssertionError(f"decide raised {exc!r}") from exc
    assert isinstance(decision, Decision) and isinstance(decision.action, Action), "not a Decision"
    assert decision.reason, "a decision without a reason"


INVARIANTS = [
    targets_only_the_expected_turn,
    never_dispatches_into_a_hazard,
    never_dispatches_without_a_grant,
    never_dispatches_a_replayed_intent,
    never_dispatches_for_an_inactive_rule,
    dispatch_unknown_always_reconciles,
    only_proposed_intents_dispatch,
    dispatches_in_the_intents_mode,
    names_the_producing_rule,
    is_deterministic,
    is_total,
]


@settings(max_examples=1000, deadline=None)
@given(inputs)
def test_invariants_hold(args: Inputs) -> None:
    for invariant in INVARIANTS:
        invariant(decide, args)


# -- the strategies reach every decision, so the invariants are not vacuous ------------


def test_inputs_reach_every_action() -> None:
    reached: set[Action] = set()

    @settings(max_examples=1000, database=None, derandomize=True, deadline=None)
    @given(inputs)
    def collect(args: Inputs) -> None:
        reached.add(decide(*args).action)

    collect()
    assert reached == set(Action)


# -- each invariant catches a decide broken the way it guards against -------------------


def _without(monkeypatch: pytest.MonkeyPatch, guard: str) -> Decide:
    """The real decide, with one of its guards always answering "no problem"."""
    monkeypatch.setattr(policy, guard, lambda *_: None)
    return decide


def _resends(states_: tuple[State, ...]) -> Decide:
    """A decide that treats intents in ``states_`` as not yet sent (the resend bug)."""
    return lambda intent, state, *rest: decide(intent, State.PROPOSED if state in states_ else state, *rest)


def _ignores_replayed(intent: Intent, *rest: Any) -> Decision:
    return decide(replace(intent, replayed=False), *rest)


def _ignores_rule_status(intent: Intent, state: State, snapshot: ThreadSnapshot, now: float, ruleset: RuleSet) -> Decision:
    promoted = tuple(replace(rule, status="active", expires=None) for rule in ruleset.rules)
    return decide(intent, state, snapshot, now, replace(ruleset, rules=promoted))


def _steers_queue_intents(*args: Any) -> Decision:
    decision = decide(*args)
    return replace(decision, action=Action.STEER) if decision.action is Action.QUEUE else decision


def _forgets_the_rule(*args: Any) -> Decision:
    return replace(decide(*args), rule_id=None, rule_version=None)


def _counts_calls() -> Decide:
    calls = itertools.count()
    return lambda *args: replace(decide(*args), reason=f"call-{next(calls)}")


def _raises_on_a_missing_turn(intent: Intent, *rest: Any) -> Decision:
    if intent.expected_turn_id is None:
        raise KeyError("expected_turn_id")
    return decide(intent, *rest)


BROKEN: list[tuple[Callable[[Decide, Inputs], None], Callable[[pytest.MonkeyPatch], Decide]]] = [
    (targets_only_the_expected_turn, lambda mp: _without(mp, "_turn_problem")),
    (never_dispatches_into_a_hazard, lambda mp: _without(mp, "hazard")),
    (never_dispatches_without_a_grant, lambda mp: _without(mp, "_refusal")),
    (never_dispatches_a_replayed_intent, lambda mp: _ignores_replayed),
    (never_dispatches_for_an_inactive_rule, lambda mp: _ignores_rule_status),
    (dispatch_unknown_always_reconciles, lambda mp: _resends((State.DISPATCH_UNKNOWN,))),
    (only_proposed_intents_dispatch, lambda mp: _resends((State.QUEUED,))),
    (dispatches_in_the_intents_mode, lambda mp: _steers_queue_intents),
    (names_the_producing_rule, lambda mp: _forgets_the_rule),
    (is_deterministic, lambda mp: _counts_calls()),
    (is_total, lambda mp: _raises_on_a_missing_turn),
]


def test_every_invariant_has_a_broken_decide() -> None:
    assert [invariant for invariant, _ in BROKEN] == INVARIANTS


@pytest.mark.parametrize(("invariant", "breakage"), BROKEN, ids=[invariant.__name__ for invariant, _ in BROKEN])
def test_invariant_catches_a_broken_decide(invariant, breakage, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision table's rows come first (deterministic); generated inputs after."""
    broken = breakage(monkeypatch)
    for case in CASES:
        try:
            invariant(broken, case_inputs(case))
        except AssertionError:
            return

    @settings(
        max_examples=2000,
        database=None,
        derandomize=True,
        phases=[Phase.generate],  # a counterexample is enough; no need to shrink it
        report_multiple_bugs=False,
        deadline=None,
    )
    @given(inputs)
    def check(args: Inputs) -> None:
        invariant(broken, args)

    with pytest.raises(AssertionError):
        check()


# -- the owner's built-in grant (no config file, or [defaults] owner_grant = false) ----------

OWNER = owner_grant().subject  # owner:<login of whoever runs the tests>
OWNER_GRANT_OFF = load_config(NO_OWNER_GRANT, "config.toml")


@st.composite
def clean_dispatch(draw: st.DrawFn) -> tuple[Intent, ThreadSnapshot, float, tuple[Rule, ...]]:
    """An intent that nothing but authority stands in the way of: its turn active, no
    hazard, not expired, its producing rule (if any) active at its version."""
    now = draw(small_times)
    thread, turn = draw(st.sampled_from(THREADS)), draw(st.sampled_from(TURNS))
    mode = draw(st.sampled_from(MODES))
    producer = draw(st.sampled_from((OWNER, "owner:someone-else", "reviewer:rex", *(f"rule:{r}" for r in RULE_IDS))))
    version = draw(st.integers(1, 3))
    intent = Intent(id="in-1", thread_id=thread, mode=mode, text="Stop; read src/rules first.", text_digest="sha256:0",
                    created_at=0.0, ack_deadline=now + 60, expires_at=now + 100, expected_turn_id=turn,
                    owner=OWNER.removeprefix("owner:"), producer=producer,
                    rule_version=version if producer.startswith("rule:") else None, force=draw(st.booleans()))
    snapshot = ThreadSnapshot(thread_id=thread, known=True, steerable=True, active_turn_id=turn,
                              turn_states={turn: "active"})
    active = tuple(replace(draw(rules), id=rule_id, version=version, status="active", expires=None)
                   for rule_id in RULE_IDS)
    return intent, snapshot, now, active


@settings(max_examples=500, deadline=None)
@given(clean_dispatch(), st.booleans())
def test_the_builtin_grant_lets_only_the_owner_steer_and_queue(inputs, owner_grant_on) -> None:
    """With no config the owner's steer and queue go out; the owner's interrupt, and
    anything a rule or a reviewer produced, is refused no_grant; with owner_grant =
    false everything is."""
    intent, snapshot, now, active_rules = inputs
    config = NO_CONFIG if owner_grant_on else OWNER_GRANT_OFF
    decision = decide(intent, State.PROPOSED, snapshot, now, build_ruleset(active_rules, config.grants()))
    if owner_grant_on and intent.producer == OWNER and intent.mode in ("steer", "queue"):
        assert (decision.action, decision.reason) == (Action(intent.mode), "authorized")
    else:
        assert (decision.action, decision.reason) == (Action.ESCALATE, "no_grant")
