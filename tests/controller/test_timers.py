"""``Timers``: the next decision round from heaps kept up to date by the fold, equal to
scanning every thread and open intent (``brute_force_due``) after any sequence of folds,
at any time, forward or back; and ``Watches``, which tells them a thread's change and
where a round need not run the detection rules (``detect`` would find nothing there)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.rule_texts import rule
from tillerman.controller.core.intent_requests import build_intent
from tillerman.controller.core.timers import Timers, brute_force_due, deadlines
from tillerman.controller.core.watches import Watches
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.projections import Projection
from tillerman.rules.detect import detect, next_due
from tillerman.rules.files import load_rules
from tillerman.rules.ruleset import build_ruleset

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC
RULES = build_ruleset(load_rules("\n".join((
    rule("quiet", condition={"kind": "turn_quiet", "for": "10m"}, action="report_overdue", text="q"),
    rule("long", condition={"kind": "turn_long", "for": "1h"}, action="report_overdue", text="l"),
    rule("approval", condition={"kind": "approval_waiting", "for": "5m"}, action="report_overdue", text="a"),
    rule("critical", condition={"kind": "critical_tool_running", "for": "15m"}, action="observe", text="c"),
    # out of force from 2027-01-16 00:00 UTC: its timer stops counting then, with no event
    rule("expiring", condition={"kind": "turn_quiet", "for": "20h"}, action="report_overdue", text="e",
         expires="2027-01-16"),
    rule("expired-long-ago", condition={"kind": "turn_quiet", "for": "1m"}, action="observe", text="x",
         expires="2027-01-01"),
)), "rules.toml"), ())
#: Without a rule leaving force: ``Timers.lower`` keeps lower bounds only then.
LASTING = build_ruleset(tuple(r for r in RULES.rules if r.expires is None), ())
THREADS = ("t1", "t2", "t3")


class Ledger:
    """A fold fed by hand: entries numbered in order, each noted by the timers. With
    ``lower``, each thread's change is told as the daemon and replay tell it, through
    their ``Watches``: its due at once (``Timers.lower``), kept as a lower bound when it
    is no earlier; a progress alone as the bound it sets (``Timers.later``)."""

    def __init__(self, *, lower: bool = False, rules=RULES) -> None:
        self.rules = rules
        self.projection = Projection()
        self.watches = Watches(self.projection, rules) if lower else None
        self.timers = self.watches.timers if self.watches is not None else Timers()
        self.seq = itertools.count(1)
        self.intents: list = []

    def fold(self, event: ev.Event, at: float) -> None:
        entry = Entry(seq=next(self.seq), envelope=Envelope(event_id=f"e{len(self.intents)}-{at}", event=event,
                                                             source="test", at=at), prev_hash="", hash="")
        self.projection.apply(entry)
        if self.watches is None:
            self.timers.note(entry)
        else:
            self.watches.note(entry, at)

    def agree(self, now: float) -> float | None:
        horizon = self.timers.horizon(now)
        due = self.timers.next_due(self.projection, self.rules, now)
        assert due == brute_force_due(self.projection, self.rules, now)
        assert (due if due is not None else math.inf) >= horizon  # nothing due before it
        # the daemon's former scan: a full snapshot and ``next_due`` for every thread
        dues = [next_due(self.projection.snapshot(t), now, self.rules) for t in self.projection.threads]
        dues += [t for v in self.projection.open_intents() for t in deadlines(v) if t > now]
        assert due == min((d for d in dues if d is not None), default=None)
        if self.watches is not None:  # a round runs ``detect`` only where it finds something
            found = {t for t in self.projection.threads if detect(self.projection.snapshot(t), now, self.rules)}
            assert found <= set(self.watches.finding(self.projection.threads, now))
        return due


def step(ledger: Ledger, op: tuple, at: float) -> None:
    kind, thread, n = op
    turn = f"{thread}-turn{n % 3}"
    item = f"{thread}-item{n % 4}"
    match kind:
        case "turn_started":
            ledger.fold(ev.TurnStarted(thread_id=thread, turn_id=turn), at)
        case "turn_completed":
            ledger.fold(ev.TurnCompleted(thread_id=thread, turn_id=turn), at)
        case "item_started":
            ledger.fold(ev.ItemStarted(thread_id=thread, turn_id=turn, item_id=item, item_type="commandExecution",
                                       critical=n % 2 == 0), at)
        case "item_completed":
            ledger.fold(ev.ItemCompleted(thread_id=thread, turn_id=turn, item_id=item,
                                         item_type="commandExecution"), at)
        case "approval_requested":
            ledger.fold(ev.ApprovalRequested(thread_id=thread, turn_id=turn, item_id=item), at)
        case "approval_resolved":
            ledger.fold(ev.ApprovalResolved(thread_id=thread, turn_id=turn, item_id=item), at)
        case "agent_message":
            ledger.fold(ev.AgentMessage(thread_id=thread, turn_id=turn, digest="d", size=1), at)
        case "propose":
            intent = build_intent(ledger.projection, thread_id=thread, mode="queue", text=f"i{n}", now=at,
                                  ack_deadline=60.0 * (n + 1), expires=3600.0 * (n % 5 + 1),
                                  effect_deadline=600.0 if n % 2 else None, expect="x" if n % 2 else None,
                                  intent_id=f"intent-{len(ledger.intents)}")
            ledger.intents.append(intent)
            ledger.fold(ev.IntentProposed(thread_id=thread, intent=intent), at)
        case "close" if ledger.intents:
            intent = ledger.intents[n % len(ledger.intents)]
            state = ledger.projection.intents[intent.id].state
            ledger.fold(ev.IntentTransition(thread_id=intent.thread_id, intent_id=intent.id, from_state=state,
                                            to_state="expired", reason="expires_at_passed"), at)


OPS = st.tuples(
    st.sampled_from(("turn_started", "turn_completed", "item_started", "item_completed", "approval_requested",
                     "approval_resolved", "agent_message", "propose", "close", "nothing")),
    st.sampled_from(THREADS), st.integers(0, 11))
# Mostly forward, in steps that cross dues; now and then back (a new replayed file).
STEPS = st.one_of(st.floats(0, 3 * 3600), st.sampled_from((0.0, 59.9, 60.0, 300.0, 600.0, 12 * 3600.0)),
                  st.floats(-6 * 3600, 0))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(STEPS, OPS, st.booleans()), max_size=60), st.booleans(), st.sampled_from((RULES, LASTING)))
def test_next_due_is_the_scan_of_every_thread_and_intent(script, lower, rules):
    ledger, now = Ledger(lower=lower, rules=rules), T0
    for dt, op, query_first in script:
        now += dt
        if query_first:  # a round with nothing folded: time alone moved
            ledger.agree(now)
        step(ledger, op, now)
        due = ledger.agree(now)
        if due is not None and due - now < 3 * 3600:  # the round itself, as the clock jumps there
            ledger.agree(due)
            now = due


def test_a_rule_leaving_force_takes_its_timer_with_it_without_an_event():
    ledger = Ledger()
    start = T0 + 12 * 3600  # 2027-01-15 20:00: the expiring rule's 20h quiet falls on the 16th
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), start)
    ledger.fold(ev.ItemStarted(thread_id="t1", turn_id="u", item_id="i", item_type="commandExecution",
                               critical=True), start)  # critical: only the turn_long timer counts
    ledger.fold(ev.ItemCompleted(thread_id="t1", turn_id="u", item_id="i", item_type="commandExecution"), start)
    assert ledger.agree(start) == start + 600  # quiet, 10m
    midnight = 1_800_057_600.0  # 2027-01-16 00:00 UTC
    assert ledger.agree(midnight - 1) == start + 20 * 3600  # still in force: its timer counts
    assert ledger.agree(midnight) is None  # out of force: nothing left, though nothing was folded


def test_an_intent_closed_or_past_its_deadlines_is_forgotten_and_time_going_back_brings_them_back():
    ledger = Ledger()
    step(ledger, ("propose", "t1", 0), T0)  # ack 60 s, expires 1 h
    assert ledger.agree(T0) == T0 + 60
    assert ledger.agree(T0 + 60) == T0 + 3600
    assert ledger.agree(T0 + 3600) is None
    assert ledger.agree(T0 + 30) == T0 + 60  # a new file's clock, earlier: the deadlines count again
    step(ledger, ("close", "t1", 0), T0 + 31)
    assert ledger.agree(T0 + 31) is None


def test_a_new_rule_set_or_projection_is_computed_afresh():
    ledger = Ledger()
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), T0)
    assert ledger.timers.next_due(ledger.projection, RULES, T0) == T0 + 600
    quiet_only = build_ruleset(RULES.rules[1:2], ())
    assert ledger.timers.next_due(ledger.projection, quiet_only, T0) == T0 + 3600
    assert ledger.timers.next_due(Projection(), quiet_only, T0) is None


def test_a_later_due_told_by_lower_is_computed_again_once_it_is_the_earliest():
    ledger = Ledger(lower=True, rules=LASTING)
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), T0)
    assert ledger.agree(T0) == T0 + 600  # quiet, 10m
    # progress moves the quiet timer later: the held entry stays, a lower bound
    ledger.fold(ev.AgentMessage(thread_id="t1", turn_id="u", digest="d", size=1), T0 + 100)
    assert ledger.timers.horizon(T0 + 100) == T0 + 600
    assert ledger.agree(T0 + 100) == T0 + 700
    ledger.fold(ev.ApprovalRequested(thread_id="t1", turn_id="u", item_id="i"), T0 + 200)  # earlier: 5m
    assert ledger.agree(T0 + 200) == T0 + 500


def test_a_progress_after_its_quiet_timer_fell_due_brings_that_timer_back_before_the_others():
    ledger = Ledger(lower=True, rules=LASTING)
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), T0)
    assert ledger.agree(T0) == T0 + 600  # quiet, 10m
    assert ledger.agree(T0 + 700) == T0 + 3600  # quiet fell due: the long turn's is next
    ledger.fold(ev.AgentMessage(thread_id="t1", turn_id="u", digest="d", size=1), T0 + 800)
    assert ledger.agree(T0 + 800) == T0 + 1400  # quiet again, from the progress


def test_watches_rebased_on_a_new_rule_set_take_each_threads_triggers_again():
    ledger = Ledger(lower=True, rules=LASTING)
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), T0)
    assert ledger.agree(T0) == T0 + 600  # quiet, 10m
    assert ledger.watches.finding(["t1"], T0 + 600) == ["t1"]
    long_only = build_ruleset(RULES.rules[1:2], ())  # the daemon reloaded its rules: turn_long, 1h
    ledger.watches.rebase(ledger.projection, long_only)
    assert ledger.timers.next_due(ledger.projection, long_only, T0) == T0 + 3600
    assert ledger.watches.finding(["t1"], T0 + 600) == []
    assert ledger.watches.finding(["t1"], T0 + 3600) == ["t1"]


def test_timers_asked_of_another_rule_set_get_that_rule_sets_triggers():
    ledger = Ledger(lower=True, rules=LASTING)
    ledger.fold(ev.TurnStarted(thread_id="t1", turn_id="u"), T0)
    assert ledger.agree(T0) == T0 + 600
    long_only = build_ruleset(RULES.rules[1:2], ())
    # no rebase by the caller: the timers' own question brings the watches along
    assert ledger.timers.next_due(ledger.projection, long_only, T0) == T0 + 3600
    assert ledger.watches.ruleset is long_only
