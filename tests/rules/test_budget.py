"""Budget rules: each measure and scope, once per crossing, through the fold, the
triggers the daemon and replay keep (``Watches``) and the rule step (``Step``)."""

from __future__ import annotations

import calendar
import datetime

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tillerman.controller.core.supervisor import Step
from tillerman.controller.core.watches import Watches
from tillerman.ledger import events as ev
from tillerman.ledger.projections import Projection
from tillerman.ledger.usage import Tokens
from tillerman.rules.detect import detect
from tillerman.rules.ruleset import Budget, Grant, Rule, build_ruleset

DAY = calendar.timegm((2026, 6, 13, 9, 0, 0))
RULE = dict(id="spend", version=1, status="active", owner="me", review_by=datetime.date(2027, 1, 1),
            action="report_overdue")


class Cost(msgspec.Struct):
    usd: float | None
    missing: str | None
    date: str


class Prices:
    """$1 per 1,000 input, $0.1 per 1,000 cached, $2 per 1,000 written, $4 per 1,000
    output; double above 200,000 input; no price for "mystery"."""

    def cost(self, model, tokens: Tokens, *, speed=None) -> Cost:
        if model == "mystery":
            return Cost(None, "no_price", "2026-06-01")
        rate = 2 if tokens.input > 200_000 else 1
        usd = (tokens.uncached_input * 1 + tokens.cached_input * 0.1 + tokens.cache_write * 2 + tokens.output * 4)
        return Cost(rate * usd / 1000, None, "2026-06-01")

    def context_window(self, model) -> int | None:
        return 1000 if model == "small" else None


def usage(input: int, output: int = 0, *, thread: str = "t", turn: str | None = "u1", at: float = DAY,
          key: str | None = None, model: str | None = "m", window: int | None = None, cached: int = 0) -> ev.Envelope:
    event = ev.Usage(thread_id=thread, turn_id=turn, source_kind="codex_live", model=model, response_key=key,
                     tokens=Tokens(input=input, cached_input=cached, output=output), context_window=window)
    return ev.Envelope(event_id=f"usage:{thread}:{turn}:{at}:{input}:{key}", event=event, source="appserver:x", at=at)


def run(envelopes, *conditions: Budget, prices=None, **rule_fields):
    """Fold each envelope and ask the rule step where the kept triggers say a rule can
    fire, as a round does; every report recorded, in order. Also checks, after every
    envelope, that the triggers and ``detect`` agree on whether there is a finding."""
    rules = [Rule(**(RULE | {"id": f"spend{i}"} | rule_fields), condition=c) for i, c in enumerate(conditions)]
    ruleset = build_ruleset(rules, (Grant(subject="*", actions=frozenset({"steer"})),), prices)
    projection, step = Projection(), Step(ruleset, replay=True)
    watches = Watches(projection, ruleset)
    recorded = []
    for seq, env in enumerate(envelopes, 1):
        projection.apply_envelope(env, seq)
        thread = env.event.thread_id
        watches.fold(thread, env.at)
        found = detect(projection.snapshot(thread), env.at, ruleset)
        assert bool(watches.finding([thread], env.at)) == bool(found)
        recorded += [e.event for e in step.step(projection, [thread], env.at)]
    return recorded


def reports(recorded) -> list[tuple[str, str]]:
    return [(r.detail["instance"], r.finding) for r in recorded if isinstance(r, ev.Report)]


def test_tokens_per_thread_cross_once_and_not_again_on_the_next_line():
    found = run([usage(400), usage(400), usage(300, 100), usage(500)], Budget(measure="tokens", over=1200))
    assert reports(found) == [("thread", "tokens per thread (thread) reached 1,200, over its limit 1,200")]
    assert found[0].detail.items() >= {"figure": 1200, "limit": 1200.0, "per": "thread", "source_kind": "codex_live",
                                       "usage_seq": 3, "responses": 3}.items()


def test_a_response_reported_twice_counts_once():
    assert reports(run([usage(600, key="r1"), usage(600, key="r1")], Budget(measure="tokens", over=1000))) == []
    assert len(reports(run([usage(600, key="r1"), usage(600, key="r2")], Budget(measure="tokens", over=1000)))) == 1


def test_per_turn_a_new_turn_is_a_new_crossing():
    found = run([usage(600), usage(600), usage(600, turn="u2"), usage(100, turn="u2"), usage(600, turn="u2")],
                Budget(measure="tokens", over=1000, per="turn"))
    assert [i for i, _ in reports(found)] == ["u1", "u2"]


def test_per_day_a_new_utc_day_is_a_new_crossing():
    found = run([usage(600), usage(600), usage(600, at=DAY + 86400), usage(600, at=DAY + 86400)],
                Budget(measure="tokens", over=1000, per="day"))
    assert [i for i, _ in reports(found)] == ["2026-06-13", "2026-06-14"]


def test_per_goal_counts_from_the_goal_and_shows_codex_own_figures():
    goal = ev.Envelope(event_id="g", source="appserver:x", at=DAY, event=ev.GoalUpdated(
        thread_id="t", status="active", objective_digest="d1", token_budget=5000, tokens_used=10))
    found = run([usage(900), goal, usage(600), usage(600)], Budget(measure="tokens", over=1000, per="goal"))
    assert reports(found) == [("d1", "tokens per goal (d1) reached 1,200, over its limit 1,000")]
    assert (found[0].detail["goal_token_budget"], found[0].detail["goal_tokens_used"]) == (5000, 10)


def test_owner_is_every_thread_of_the_day_together_and_reported_once():
    found = run([usage(600, thread="a"), usage(600, thread="b"), usage(600, thread="a")],
                Budget(measure="tokens", over=1000, per="owner"))
    assert [(r.thread_id, r.detail["instance"]) for r in found] == [("b", "2026-06-13")]


def test_cost_is_priced_per_response_band_and_records_the_table_date():
    # two 150k responses are priced at the base rate, though together over 200k
    found = run([usage(150_000), usage(150_000)], Budget(measure="cost_usd", over=299.0), prices=Prices())
    assert reports(found) == [("thread", "cost per thread (thread) reached $300.00, over its limit $299.00")]
    assert found[0].detail["price_date"] == "2026-06-01" and found[0].detail["unpriced_models"] == ""
    # one 250k response is priced wholly at the long-context rate
    assert reports(run([usage(250_000)], Budget(measure="cost_usd", over=499.0), prices=Prices()))[0][1] \
        .startswith("cost per thread (thread) reached $500.00")


def test_an_unpriced_model_adds_nothing_and_is_named():
    found = run([usage(1000, model="mystery"), usage(1000, 500)], Budget(measure="cost_usd", over=2.0),
                prices=Prices())
    assert found[0].detail["figure"] == 3.0 and found[0].detail["unpriced_models"] == "mystery"
    recorded = ev.Envelope(event_id="r", source="s", at=DAY, event=ev.Report(
        thread_id="t", rule_id="spend", rule_version=1, finding="f", detail=found[0].detail))
    assert msgspec.json.decode(msgspec.json.encode(recorded), type=ev.Envelope) == recorded  # a ledger can read it


def test_no_price_table_no_cost_budget_fires():
    assert run([usage(10**6)], Budget(measure="cost_usd", over=0.01)) == []


def test_context_uses_the_last_response_and_the_window_from_the_source_or_the_table():
    condition = Budget(measure="context", over=0.9, per="turn")
    found = run([usage(800, window=1000), usage(950, window=1000), usage(990, window=1000),
                 usage(100, turn="u2"), usage(920, turn="u2")], condition)
    assert [(i, f) for i, f in reports(found)] == [
        ("u1", "context used per turn (u1) reached 95%, over its limit 90%"),
        ("u2", "context used per turn (u2) reached 92%, over its limit 90%")]
    assert found[0].detail.items() >= {"last_input": 950, "context_window": 1000}.items()
    assert len(reports(run([usage(950, model="small")], condition, prices=Prices()))) == 1
    assert reports(run([usage(950, model="other")], condition, prices=Prices())) == []


def test_shadow_expired_and_other_threads():
    over = [usage(2000)]
    shadow = run(over, Budget(measure="tokens", over=1000), status="shadow")
    assert shadow[0].detail["shadow"] is True
    assert run(over, Budget(measure="tokens", over=1000), expires=datetime.date(2026, 6, 1)) == []
    assert run(over, Budget(measure="tokens", over=1000), threads=("other",)) == []
    assert len(reports(run(over, Budget(measure="tokens", over=1000), threads=("t",)))) == 1


def test_a_steer_rule_proposes_one_intent_into_the_running_turn():
    start = ev.Envelope(event_id="s", source="appserver:x", at=DAY, event=ev.TurnStarted(thread_id="t", turn_id="u1"))
    found = run([start, usage(600), usage(600), usage(600)], Budget(measure="tokens", over=1000), action="steer",
                text="Wrap up: {figure} tokens, limit {limit} per {per}.")
    proposed = [e for e in found if isinstance(e, ev.IntentProposed)]
    assert len(proposed) == 1
    assert proposed[0].intent.text == "Wrap up: 1,200 tokens, limit 1,000 per thread."
    assert proposed[0].intent.expected_turn_id == "u1"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.booleans(), st.booleans()), min_size=1, max_size=40))
def test_however_the_usage_is_split_each_crossing_fires_once(lines):
    """Each line: its tokens, whether a new turn starts before it, whether it is sent
    twice. Every turn whose sum reaches the limit is reported exactly once."""
    envelopes, turn, sums = [], 0, {}
    for index, (tokens, new_turn, twice) in enumerate(lines):
        turn += new_turn
        sums[f"u{turn}"] = sums.get(f"u{turn}", 0) + tokens
        envelopes.append(usage(tokens, turn=f"u{turn}", key=f"k{index}"))
        if twice:
            envelopes.append(envelopes[-1])
    found = run(envelopes, Budget(measure="tokens", over=500, per="turn"))
    assert [i for i, _ in reports(found)] == [t for t, total in sums.items() if total >= 500]


def claude_usage(input: int, output: int, *, request: str, thread: str = "t", sidechain: bool = False,
                 at: float = DAY) -> ev.Envelope:
    event = ev.Usage(thread_id=thread, turn_id="u1", source_kind="claude_transcript", model="m", message_id="msg_1",
                     request_id=request, sidechain=sidechain, tokens=Tokens(input=input, output=output))
    return ev.Envelope(event_id=f"claude:{thread}:{request}:{output}", event=event, source="claude:x", at=at)


def test_a_better_duplicate_replaces_the_earlier_copy_and_the_figure_follows():
    # ccusage keeps the larger of two copies of one response (the usage account's rule):
    # the budget counts 100 + 900, not the first copy's 100 + 10, nor both.
    copies = [claude_usage(100, 10, request="r1"), claude_usage(100, 900, request="r1")]
    found = run(copies, Budget(measure="tokens", over=1000))
    assert reports(found) == [("thread", "tokens per thread (thread) reached 1,000, over its limit 1,000")]
    projection = Projection()
    for seq, env in enumerate(copies, 1):
        projection.apply_envelope(env, seq)
    figures = projection.threads["t"].usage
    assert (figures.thread.tokens.total, figures.thread.responses, figures.turn.tokens.total) == (1000, 1, 1000)
    assert [part.tokens.output for part in figures.thread.parts] == [900]


def test_a_sidechain_copy_counted_in_another_thread_is_taken_back_there():
    # /btw replays a parent message in a sidechain; the non-sidechain copy wins, across threads.
    projection = Projection()
    for seq, env in enumerate([claude_usage(50, 50, request="r2", thread="side", sidechain=True),
                               claude_usage(50, 50, request="r1", thread="main")], 1):
        projection.apply_envelope(env, seq)
    assert projection.threads["side"].usage.thread.tokens.total == 0
    assert projection.threads["main"].usage.thread.tokens.total == 100


def test_the_dedup_survives_the_snapshot():
    projection = Projection()
    projection.apply_envelope(claude_usage(100, 10, request="r1"), 1)
    restored = msgspec.msgpack.decode(msgspec.msgpack.encode(projection), type=Projection)
    restored.apply_envelope(claude_usage(100, 10, request="r1"), 2)
    restored.apply_envelope(claude_usage(100, 900, request="r1"), 3)
    assert restored.threads["t"].usage.thread.tokens.total == 1000


def test_a_steer_rule_records_the_figure_beside_its_proposal():
    start = ev.Envelope(event_id="s", source="appserver:x", at=DAY, event=ev.TurnStarted(thread_id="t", turn_id="u1"))
    found = run([start, usage(600), usage(600), usage(600)], Budget(measure="tokens", over=1000), action="steer",
                text="Wrap up.")
    (proposed,) = [e for e in found if isinstance(e, ev.IntentProposed)]
    (report,) = [e for e in found if isinstance(e, ev.Report)]
    assert report.detail.items() >= {"figure": 1200, "limit": 1000.0, "source_kind": "codex_live", "action": "steer",
                                     "proposed": proposed.intent.id}.items()
