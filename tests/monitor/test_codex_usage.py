"""Codex usage as facts: ``token_count`` records of a rollout and the app-server's
``thread/tokenUsage/updated``, mapped to ``Usage`` (docs/design.md "The usage account")."""

from __future__ import annotations

import json

import pytest

from tests.monitor.support import events, parse, reasons
from tillerman.ledger.events import ModelUsage, Quarantined, Usage, UsageReported
from tillerman.ledger.usage import Tokens, UsageRefused
from tillerman.monitor.appserver_events import AppServerEvents, decode_hot
from tillerman.monitor.appserver_tap import AppServerTap
from tillerman.monitor.codex_rollout import token_count_usage
from tillerman.monitor.jsonrpc import RpcSession

THREAD = "0199a1b2-0000-7000-8000-00000000aa01"


def rollout_usage(input_tokens: int, cached: int, output: int, reasoning: int, **extra) -> dict:
    return {"input_tokens": input_tokens, "cached_input_tokens": cached, "cache_write_input_tokens": 0,
            "output_tokens": output, "reasoning_output_tokens": reasoning,
            "total_tokens": input_tokens + output, **extra}


def token_count(total: dict | None = None, last: dict | None = None, window: int | None = 258400) -> dict:
    info: dict = {"total_token_usage": total}
    if last is not None:
        info["last_token_usage"] = last
    if window is not None:
        info["model_context_window"] = window
    return {"type": "token_count", "info": info, "rate_limits": {"primary": None}}


def usage_of(payload: dict, previous: Tokens | None = None) -> Usage | None:
    return token_count_usage(payload, thread_id=THREAD, turn_id="T1", model="gpt-5.5", previous_total=previous)


# -- token_count (rollouts) ----------------------------------------------------------


def test_a_token_count_is_the_last_responses_figures_with_the_threads_total():
    used = usage_of(token_count(total=rollout_usage(3000, 1000, 300, 40), last=rollout_usage(1200, 1000, 100, 40)))
    assert used == Usage(
        source_kind="codex_rollout", thread_id=THREAD, turn_id="T1", model="gpt-5.5", context_window=258400,
        tokens=Tokens(input=1200, cached_input=1000, output=100, reasoning=40),
        total=Tokens(input=3000, cached_input=1000, output=300, reasoning=40),
        response_key=f"{THREAD}:3000:1000:0:0:300:40",
    )
    assert used.tokens.total == 1300  # cached input inside input, reasoning inside output: nothing twice


def test_info_null_carries_only_rate_limits_and_counts_nothing():
    assert usage_of({"type": "token_count", "info": None, "rate_limits": {"primary": {"used_percent": 3}}}) is None


def test_without_last_token_usage_the_response_is_the_rise_of_the_files_total():
    first = usage_of(token_count(total=rollout_usage(5200, 0, 310, 0), window=None))
    assert first.tokens == Tokens(input=5200, output=310) and first.context_window is None
    second = usage_of(token_count(total=rollout_usage(11000, 5000, 500, 20), window=None), previous=first.total)
    assert second.tokens == Tokens(input=5800, cached_input=5000, output=190, reasoning=20)


def test_a_rise_that_is_no_responses_figures_is_refused():
    previous = Tokens(input=5200, output=310)
    with pytest.raises(UsageRefused) as refused:
        usage_of(token_count(total=rollout_usage(9000, 4000, 500, 0)), previous=previous)
    assert refused.value.reason == "usage_inconsistent"


def test_an_unchanged_total_without_last_token_usage_is_no_response():
    total = rollout_usage(5200, 0, 310, 0)
    first = usage_of(token_count(total=total))
    assert usage_of(token_count(total=total), previous=first.total) is None


def test_a_total_that_fell_without_last_token_usage_is_refused_not_floored():
    previous = Tokens(input=9000, output=500)
    with pytest.raises(UsageRefused) as refused:
        usage_of(token_count(total=rollout_usage(5200, 0, 310, 0)), previous=previous)
    assert (refused.value.reason, refused.value.field) == ("usage_inconsistent", "total_token_usage")


def test_a_thread_less_record_has_no_response_key():
    used = token_count_usage(token_count(total=rollout_usage(10, 0, 1, 0), last=rollout_usage(10, 0, 1, 0)),
                             thread_id=None, turn_id=None, model=None, previous_total=None)
    assert used.response_key is None and used.tokens == Tokens(input=10, output=1)


HOSTILE_ROLLOUT = [
    ({"input_tokens": -5, "output_tokens": 1}, "usage_negative", "input_tokens"),
    ({"input_tokens": 5.5, "output_tokens": 1}, "usage_not_integer", "input_tokens"),
    ({"input_tokens": "123", "output_tokens": 1}, "usage_not_integer", "input_tokens"),
    ({"input_tokens": True, "output_tokens": 1}, "usage_not_integer", "input_tokens"),
    ({"input_tokens": 10**400, "output_tokens": 1}, "usage_out_of_range", "input_tokens"),
    ({"input_tokens": 10**9 + 1, "output_tokens": 1}, "usage_out_of_range", "input_tokens"),
    ({"input_tokens": None, "output_tokens": 1}, "usage_missing_field", "input_tokens"),
    ({"output_tokens": 1}, "usage_missing_field", "input_tokens"),
    ({"input_tokens": 5, "cached_input_tokens": 6, "output_tokens": 1}, "usage_inconsistent", "cached_input"),
    ({"input_tokens": 5, "output_tokens": 1, "reasoning_output_tokens": 2}, "usage_inconsistent", "reasoning"),
    ({"input_tokens": 5, "output_tokens": 1, "total_tokens": 7}, "usage_inconsistent", "total_tokens"),
]


@pytest.mark.parametrize(("last", "reason", "field"), HOSTILE_ROLLOUT)
def test_each_hostile_figure_is_refused_with_its_reason(last, reason, field):
    with pytest.raises(UsageRefused) as refused:
        usage_of(token_count(total=rollout_usage(3000, 0, 300, 0), last=last))
    assert (refused.value.reason, refused.value.field) == (reason, field)


@pytest.mark.parametrize(("info", "reason"), [
    ("nonsense", "usage_missing_field"),
    ({"last_token_usage": {"input_tokens": 1, "output_tokens": 1}}, "usage_missing_field"),
    ({"total_token_usage": {"input_tokens": 10**16, "output_tokens": 1}}, "usage_out_of_range"),
    ({"total_token_usage": {"input_tokens": 1, "output_tokens": 1}, "model_context_window": -1}, "usage_negative"),
])
def test_a_broken_info_is_refused(info, reason):
    with pytest.raises(UsageRefused) as refused:
        usage_of({"type": "token_count", "info": info})
    assert refused.value.reason == reason


def test_a_thread_total_may_pass_one_responses_limit():
    big = rollout_usage(5 * 10**9, 0, 10**6, 0)
    assert usage_of(token_count(total=big, last=rollout_usage(10, 0, 1, 0))).total.input == 5 * 10**9


# -- the rollout parser ----------------------------------------------------------------


def rollout_lines(*records: tuple[str, dict]) -> bytes:
    return "".join(json.dumps({"timestamp": "2026-11-30T00:00:00.000Z", "type": kind, "payload": body}) + "\n"
                   for kind, body in records).encode()


def test_a_rollouts_token_count_is_usage_on_the_turn_and_model_of_the_turn_context_before_it():
    data = rollout_lines(
        ("session_meta", {"id": THREAD}),
        ("event_msg", {"type": "task_started", "turn_id": "T1"}),
        ("turn_context", {"turn_id": "T1", "model": "gpt-5.5"}),
        ("event_msg", token_count(total=rollout_usage(1200, 1000, 100, 40), last=rollout_usage(1200, 1000, 100, 40))),
        ("event_msg", {"type": "token_count", "info": None, "rate_limits": {}}),
        ("event_msg", {"type": "task_complete", "turn_id": "T1"}),
        ("event_msg", {"type": "task_started", "turn_id": "T2"}),
        ("turn_context", {"turn_id": "T2", "model": "gpt-5.4-mini"}),
        ("event_msg", token_count(total=rollout_usage(3000, 2000, 300, 40), last=rollout_usage(1800, 1000, 200, 0))),
    )
    parsed, _ = parse("codex-rollout", data)
    used = [(p.event, p.offset) for p in parsed if isinstance(p.event, Usage)]
    assert [(u.turn_id, u.model, u.tokens.total, u.total.total) for u, _ in used] == [
        ("T1", "gpt-5.5", 1300, 1300), ("T2", "gpt-5.4-mini", 2000, 3300)]
    assert used[0][1] == data.index(b'{"timestamp"', data.index(b"turn_context"))  # the record's own offset
    assert all(u.thread_id == THREAD and u.source_kind == "codex_rollout" for u, _ in used)


def test_an_old_rollout_without_last_token_usage_counts_the_rise_of_its_total():
    data = rollout_lines(
        ("session_meta", {"id": THREAD}),
        ("turn_context", {"model": "gpt-5-codex"}),  # old CLIs: no turn id, the open turn is used
        ("event_msg", {"type": "user_message", "message": "go"}),
        ("event_msg", token_count(total=rollout_usage(5200, 0, 310, 0), window=None)),
        ("event_msg", token_count(total=rollout_usage(5200, 0, 310, 0), window=None)),  # repeated: nothing new
        ("event_msg", token_count(total=rollout_usage(8000, 2000, 400, 0), window=None)),
    )
    used = [e for e in events("codex-rollout", data) if isinstance(e, Usage)]
    assert [u.tokens for u in used] == [Tokens(input=5200, output=310), Tokens(input=2800, cached_input=2000, output=90)]
    assert all(u.turn_id and u.turn_id.startswith("turn@") and u.model == "gpt-5-codex" for u in used)


@pytest.mark.parametrize(("last", "reason", "field"), HOSTILE_ROLLOUT)
def test_a_hostile_token_count_is_quarantined_with_its_reason_and_reading_goes_on(last, reason, field):
    data = rollout_lines(
        ("session_meta", {"id": THREAD}),
        ("event_msg", token_count(total=rollout_usage(3000, 0, 300, 0), last=last)),
        ("event_msg", token_count(total=rollout_usage(3100, 0, 310, 0), last=rollout_usage(100, 0, 10, 0))),
    )
    evs = events("codex-rollout", data)
    assert reasons(evs) == [reason]
    assert [u.tokens.total for u in evs if isinstance(u, Usage)] == [110]


# -- thread/tokenUsage/updated (the app-server) ---------------------------------------


def live_usage(input_tokens: int, cached: int, output: int, reasoning: int, **extra) -> dict:
    return {"totalTokens": input_tokens + output, "inputTokens": input_tokens, "cachedInputTokens": cached,
            "cacheWriteInputTokens": 0, "outputTokens": output, "reasoningOutputTokens": reasoning, **extra}


def token_usage_note(total: dict | None, last: dict | None, window: int | None = 258400, turn: str = "T1") -> dict:
    return {"method": "thread/tokenUsage/updated", "emittedAtMs": 1796000000000,
            "params": {"threadId": THREAD, "turnId": turn,
                       "tokenUsage": {"total": total, "last": last, "modelContextWindow": window}}}


def tap_receive(tap: AppServerTap, message: dict, *, typed: bool) -> list:
    frame = json.dumps(message)
    decoded = decode_hot(frame) if typed else None
    if typed:
        assert decoded is not None  # the notification is on the hot path
    return tap.receive(decoded if typed else RpcSession().receive(frame), now=1000.0).envelopes


def test_a_token_usage_notification_is_the_last_response_with_the_threads_total():
    mapping = AppServerEvents()
    [used] = mapping.normalize(token_usage_note(live_usage(3000, 1000, 300, 40), live_usage(1200, 1000, 100, 40)))
    assert used == Usage(
        source_kind="codex_live", thread_id=THREAD, turn_id="T1", context_window=258400,
        tokens=Tokens(input=1200, cached_input=1000, output=100, reasoning=40),
        total=Tokens(input=3000, cached_input=1000, output=300, reasoning=40),
        response_key=f"{THREAD}:3000:1000:0:0:300:40",
    )
    # the rollout's record of the same response joins it
    rollout = usage_of(token_count(total=rollout_usage(3000, 1000, 300, 40), last=rollout_usage(1200, 1000, 100, 40)))
    assert rollout.response_key == used.response_key and rollout.tokens == used.tokens


def test_the_model_is_the_one_the_thread_was_resumed_changed_or_rerouted_to():
    mapping = AppServerEvents()
    first = token_usage_note(live_usage(10, 0, 1, 0), live_usage(10, 0, 1, 0))
    assert mapping.normalize(first)[0].model is None  # nothing has named it yet
    mapping.response("thread/resume", {"thread": {"id": THREAD}, "model": "gpt-5.5"})
    assert mapping.normalize(first)[0].model == "gpt-5.5"
    mapping.normalize({"method": "thread/settings/updated",
                       "params": {"threadId": THREAD, "threadSettings": {"model": "gpt-5.4-mini"}}})
    assert mapping.normalize(first)[0].model == "gpt-5.4-mini"
    mapping.normalize({"method": "model/rerouted", "params": {"threadId": THREAD, "turnId": "T1",
                                                              "fromModel": "gpt-5.4-mini", "toModel": "gpt-5.5-pro"}})
    assert mapping.normalize(first)[0].model == "gpt-5.5-pro"


@pytest.mark.parametrize("typed", [False, True], ids=["dict", "typed"])
def test_a_token_usage_notification_is_recorded_once_per_response(typed):
    tap = AppServerTap("unix:///x")
    message = token_usage_note(live_usage(3000, 1000, 300, 40), live_usage(1200, 1000, 100, 40))
    [first] = tap_receive(tap, message, typed=typed)
    [again] = tap_receive(tap, message | {"emittedAtMs": 1796000000999}, typed=typed)  # seen again: same fact
    later = token_usage_note(live_usage(4300, 2000, 400, 40), live_usage(1300, 1000, 100, 0))
    [other] = tap_receive(tap, later, typed=typed)
    assert first.event_id == again.event_id != other.event_id
    assert isinstance(first.event, Usage) and first.event.tokens.total == 1300


HOSTILE_LIVE = [
    ({"inputTokens": -5, "outputTokens": 1}, "usage_negative"),
    ({"inputTokens": 5.5, "outputTokens": 1}, "usage_not_integer"),
    ({"inputTokens": "123", "outputTokens": 1}, "usage_not_integer"),
    ({"inputTokens": 10**9 + 1, "outputTokens": 1}, "usage_out_of_range"),
    ({"totalTokens": 1000}, "usage_missing_field"),  # a bare total cannot be split into input and output
    ({}, "usage_missing_field"),
    (None, "usage_missing_field"),
    ({"inputTokens": 5, "cachedInputTokens": 6, "outputTokens": 1}, "usage_inconsistent"),
    ({"inputTokens": 5, "outputTokens": 1, "reasoningOutputTokens": 2}, "usage_inconsistent"),
    ({"inputTokens": 5, "outputTokens": 1, "totalTokens": 7}, "usage_inconsistent"),
]


@pytest.mark.parametrize("typed", [False, True], ids=["dict", "typed"])
@pytest.mark.parametrize(("last", "reason"), HOSTILE_LIVE)
def test_a_hostile_token_usage_notification_is_quarantined_with_its_reason(last, reason, typed):
    tap = AppServerTap("unix:///x")
    [envelope] = tap_receive(tap, token_usage_note(live_usage(3000, 0, 300, 0), last), typed=typed)
    assert isinstance(envelope.event, Quarantined) and envelope.event.reason == reason
    # the tap goes on: the next good notification is recorded
    [good] = tap_receive(tap, token_usage_note(live_usage(3100, 0, 310, 0), live_usage(100, 0, 10, 0)), typed=typed)
    assert isinstance(good.event, Usage)


@pytest.mark.parametrize("typed", [False, True], ids=["dict", "typed"])
def test_a_figure_beyond_a_double_is_out_of_range_either_way(typed):
    tap = AppServerTap("unix:///x")
    message = token_usage_note({"inputTokens": 10**400, "outputTokens": 1}, live_usage(1, 0, 1, 0))
    [envelope] = tap_receive(tap, message, typed=typed)
    assert isinstance(envelope.event, Quarantined) and envelope.event.reason == "usage_out_of_range"


# -- account/usage/read (the server's own estimate) -----------------------------------

def account_usage(micros: int | None = 1_234_567, groups: list | None = None) -> dict:
    """An ``account/usage/read`` answer for THREAD, in the 0.171.0 schema's shape."""
    return {"summary": {"lifetimeTokens": None}, "dailyUsageBuckets": None,
            "threadUsage": {"threadId": THREAD, "estimatedUsageCreditsMicros": 9, "estimatedUsageUsdMicros": micros,
                            "nativeUsageUsdMicros": None, "groups": groups or []}}


def turn_completed(turn_id: str = "T1") -> dict:
    return {"method": "turn/completed", "emittedAtMs": 1796000000000,
            "params": {"threadId": THREAD, "turn": {"id": turn_id, "status": "completed", "items": []}}}


def test_the_account_estimate_is_kept_as_dollars_with_its_models_beside_ours():
    group = {"model": "gpt-5.5", "inputTokens": 3000, "cachedInputTokens": 1000, "outputTokens": 300,
             "totalTokens": 3300, "estimatedUsageCreditsMicros": 5, "speed": None}
    unknown = {"model": "gpt-5.4-mini", "inputTokens": None, "outputTokens": None, "estimatedUsageCreditsMicros": 1}
    [reported] = AppServerEvents().account_usage(account_usage(groups=[group, unknown]), "T1")
    assert reported == UsageReported(
        source_kind="codex_account", thread_id=THREAD, turn_id="T1", cost_usd=1.234567,
        models=(ModelUsage(model="gpt-5.5", tokens=Tokens(input=3000, cached_input=1000, output=300)),))


def test_an_unknown_estimate_is_null_and_no_thread_usage_is_nothing():
    [reported] = AppServerEvents().account_usage(account_usage(micros=None), "T1")
    assert reported.cost_usd is None  # unknown, never 0
    assert AppServerEvents().account_usage({"summary": {}, "threadUsage": None}, "T1") == []


@pytest.mark.parametrize(("micros", "reason"), [
    (-1, "usage_negative"), (1.5, "usage_not_integer"), ("12", "usage_not_integer"), (10**400, "usage_out_of_range")])
def test_a_hostile_account_estimate_is_quarantined_with_its_reason(micros, reason):
    [envelope] = AppServerTap("unix:///x").account_usage(account_usage(micros=micros), "T1", now=1000.0)
    assert isinstance(envelope.event, Quarantined) and envelope.event.reason == reason


def test_a_hostile_account_group_is_quarantined():
    bad = {"model": "gpt-5.5", "inputTokens": 5, "cachedInputTokens": 6, "outputTokens": 1}
    [envelope] = AppServerTap("unix:///x").account_usage(account_usage(groups=[bad]), "T1", now=1000.0)
    assert isinstance(envelope.event, Quarantined) and envelope.event.reason == "usage_inconsistent"


def test_the_account_estimate_is_recorded_once_per_turn():
    tap = AppServerTap("unix:///x")
    [first] = tap.account_usage(account_usage(), "T1", now=1000.0)
    [again] = tap.account_usage(account_usage(micros=2_000_000), "T1", now=1001.0)  # read again after a reconnect
    [next_turn] = tap.account_usage(account_usage(micros=2_000_000), "T2", now=1002.0)
    assert first.event_id == again.event_id != next_turn.event_id


def test_each_ended_turn_asks_for_the_estimate_until_the_server_refuses_it_on_that_connection():
    tap = AppServerTap("unix:///x")
    ended = tap_receive(tap, turn_completed("T1"), typed=False)
    assert tap.account_usage_wanted(ended) == [(THREAD, "T1")]
    tap.account_usage_refused = "-32600: codex account authentication required to read token usage"
    assert tap.account_usage_wanted(tap_receive(tap, turn_completed("T2"), typed=False)) == []
    tap.connected()  # a new connection (perhaps a newer server, or one signed in) is asked once more
    assert tap.account_usage_wanted(tap_receive(tap, turn_completed("T3"), typed=False)) == [(THREAD, "T3")]
