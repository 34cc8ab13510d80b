"""Claude Code usage as facts: a transcript's ``message.usage`` and ``cost-state`` line,
stream-json's ``result`` (docs/design.md "The usage account")."""

from __future__ import annotations

import json

import pytest

from tests.monitor.support import events, reasons
from tillerman.ledger.events import ModelUsage, TurnCompleted, Usage, UsageReported
from tillerman.ledger.usage import Tokens, UsageRefused
from tillerman.monitor.claude_transcript import transcript_usage

SESSION = "7f3c2a10-5b4e-4d21-9c8a-1e2f3a4b5c6d"


def assistant(usage: dict | None, **fields) -> dict:
    message = {"id": "msg_01", "model": "claude-sonnet-4-5", "role": "assistant",
               "content": [{"type": "text", "text": "hi"}], "stop_reason": None}
    if usage is not None:
        message["usage"] = usage
    return {"type": "assistant", "sessionId": SESSION, "uuid": "a1", "requestId": "req_01", "isSidechain": False,
            "timestamp": "2026-06-13T10:00:00.000Z", "message": message, **fields}


def api_usage(**figures) -> dict:
    return {"input_tokens": 3, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 28,
            "output_tokens": 31, **figures}


def usage_of(entry: dict) -> Usage | None:
    return transcript_usage(entry, thread_id=SESSION, turn_id="T1")


# -- the mapping table ----------------------------------------------------------------


@pytest.mark.parametrize(("usage", "tokens"), [
    pytest.param(api_usage(), Tokens(input=1031, cached_input=1000, cache_write=28, output=31), id="cache total only"),
    pytest.param(api_usage(cache_creation={"ephemeral_5m_input_tokens": 21, "ephemeral_1h_input_tokens": 7}),
                 Tokens(input=1031, cached_input=1000, cache_write=28, cache_write_1h=7, output=31), id="5m and 1h tiers"),
    pytest.param({"input_tokens": 10, "output_tokens": 5}, Tokens(input=10, output=5), id="no cache fields"),
    pytest.param(api_usage(output_tokens_details={"thinking_tokens": 12}),
                 Tokens(input=1031, cached_input=1000, cache_write=28, output=31, reasoning=12), id="thinking"),
])
def test_an_assistant_entrys_usage_is_its_responses_figures(usage, tokens):
    assert usage_of(assistant(usage)) == Usage(
        source_kind="claude_transcript", tokens=tokens, model="claude-sonnet-4-5", message_id="msg_01",
        request_id="req_01", thread_id=SESSION, turn_id="T1")


def test_sidechain_synthetic_model_and_fast_speed():
    entry = assistant(api_usage(speed="fast"), isSidechain=True)
    entry["message"]["model"] = "<synthetic>"
    usage = usage_of(entry)
    assert (usage.sidechain, usage.model, usage.speed) == (True, None, "fast")
    assert usage_of(assistant(api_usage(speed="standard"))).speed is None


@pytest.mark.parametrize("entry", [
    assistant(None), {"type": "user", "message": {"usage": api_usage()}}, {"type": "assistant", "message": "text"},
    assistant({"input_tokens": 1, "output_tokens": 1}) | {"type": "progress"},
])
def test_entries_without_a_responses_usage_give_none(entry):
    assert usage_of(entry) is None


def test_every_content_block_of_one_response_reports_it_under_the_same_key():
    """The CLI writes one entry per content block, each with the response's usage: each
    gives its event (the account keeps one per key), none is dropped here."""
    lines = [assistant(api_usage(), uuid=f"a{i}") for i in range(2)]
    found = [e for e in events("claude-transcript", _jsonl(*lines)) if isinstance(e, Usage)]
    assert [(e.message_id, e.request_id, e.tokens.total) for e in found] == [("msg_01", "req_01", 1062)] * 2


def test_a_usage_event_is_on_its_entrys_turn_before_the_turn_ends():
    prompt = {"type": "user", "sessionId": SESSION, "uuid": "u1", "timestamp": "2026-06-13T10:00:00.000Z",
              "message": {"role": "user", "content": "go"}}
    reply = assistant(api_usage())
    reply["message"]["stop_reason"] = "end_turn"
    found = [e for e in events("claude-transcript", _jsonl(prompt, reply)) if isinstance(e, (Usage, TurnCompleted))]
    assert [(type(e).__name__, e.turn_id) for e in found] == [("Usage", "u1"), ("TurnCompleted", "u1")]


# -- hostile figures --------------------------------------------------------------------


@pytest.mark.parametrize(("usage", "reason"), [
    (api_usage(input_tokens=-1), "usage_negative"),
    (api_usage(output_tokens=2.5), "usage_not_integer"),
    (api_usage(cache_read_input_tokens="100"), "usage_not_integer"),
    (api_usage(input_tokens=10**400), "usage_out_of_range"),
    (api_usage(output_tokens=10**9 + 1), "usage_out_of_range"),
    ({"input_tokens": 3}, "usage_missing_field"),
    (api_usage(output_tokens=None), "usage_missing_field"),
    ("lots", "usage_missing_field"),
    (api_usage(cache_creation={"ephemeral_5m_input_tokens": 1, "ephemeral_1h_input_tokens": 1}), "usage_inconsistent"),
    (api_usage(output_tokens_details={"thinking_tokens": 32}), "usage_inconsistent"),
])
def test_a_hostile_figure_is_refused_and_its_line_quarantined_with_the_reason(usage, reason):
    with pytest.raises(UsageRefused) as refused:
        usage_of(assistant(usage))
    assert refused.value.reason == reason
    if reason == "usage_out_of_range" and usage["input_tokens"] == 10**400:
        return  # past any JSON number a decoder reads: the line is refused before its usage is read
    assert reasons(events("claude-transcript", _jsonl(assistant(usage)))) == [reason]


@pytest.mark.parametrize(("field", "value"), [("model", 5), ("id", ["m"]), ("requestId", 7), ("isSidechain", "no")])
def test_an_id_or_model_of_the_wrong_type_is_refused(field, value):
    entry = assistant(api_usage())
    (entry if field in ("requestId", "isSidechain") else entry["message"])[field] = value
    with pytest.raises(UsageRefused) as refused:
        usage_of(entry)
    assert (refused.value.reason, refused.value.field) == ("wrong_type", field)


# -- the CLI's own account: cost-state and result ---------------------------------------

MODEL_USAGE = {"claude-opus-5-5": {
    "inputTokens": 609, "outputTokens": 96, "thinkingTokens": 0, "cacheReadInputTokens": 6000,
    "cacheCreationInputTokens": 108, "cacheCreationEphemeral5mInputTokens": 66,
    "cacheCreationEphemeral1hInputTokens": 42, "webSearchRequests": 0, "costUSD": 0.006222}}
OPUS = ModelUsage(model="claude-opus-5-5", cost_usd=0.006222,
                  tokens=Tokens(input=6717, cached_input=6000, cache_write=108, cache_write_1h=42, output=96))


def cost_state(**fields) -> dict:
    return {"type": "cost-state", "sessionId": SESSION, "totalCostUSD": 0.006222, "totalDuration": 961,
            "modelUsage": MODEL_USAGE, "hasUnknownModelCost": False, **fields}


def test_the_cost_state_line_is_the_clis_account_of_the_session():
    reported = [e for e in events("claude-transcript", _jsonl(cost_state())) if isinstance(e, UsageReported)]
    assert reported == [UsageReported(source_kind="claude_cost_state", cost_usd=0.006222, models=(OPUS,),
                                      thread_id=SESSION)]
    empty = [e for e in events("claude-transcript", _jsonl(cost_state(totalCostUSD=0, modelUsage={})))
             if isinstance(e, UsageReported)]
    assert empty == [UsageReported(source_kind="claude_cost_state", cost_usd=0.0, thread_id=SESSION)]


def result(**fields) -> dict:
    usage = {"input_tokens": 303, "cache_creation_input_tokens": 44, "cache_read_input_tokens": 3000,
             "output_tokens": 33, "output_tokens_details": {"thinking_tokens": 0},
             "cache_creation": {"ephemeral_1h_input_tokens": 21, "ephemeral_5m_input_tokens": 23}, "speed": "standard"}
    return {"type": "result", "subtype": "success", "is_error": False, "session_id": SESSION, "duration_ms": 9,
            "total_cost_usd": 0.006222, "usage": usage, "modelUsage": MODEL_USAGE, "terminal_reason": "completed",
            **fields}


def test_a_result_reports_its_querys_tokens_and_the_cumulative_cost_and_models():
    init = {"type": "system", "subtype": "init", "session_id": SESSION, "uuid": "i1", "user_message_uuids": ["u1"]}
    found = [e for e in events("claude-stream-json", _jsonl(init, result())) if isinstance(e, (UsageReported,
                                                                                               TurnCompleted))]
    assert found[0] == UsageReported(
        source_kind="claude_stream", cost_usd=0.006222, models=(OPUS,), thread_id=SESSION, turn_id="u1",
        tokens=Tokens(input=3347, cached_input=3000, cache_write=44, cache_write_1h=21, output=33))
    assert isinstance(found[1], TurnCompleted) and found[1].turn_id == "u1"


@pytest.mark.parametrize(("fields", "reason"), [
    ({"total_cost_usd": -0.5}, "usage_negative"),
    ({"total_cost_usd": "0.1"}, "wrong_type"),
    ({"total_cost_usd": 1e12}, "usage_out_of_range"),
    ({"modelUsage": {"m": {"inputTokens": -3, "outputTokens": 1}}}, "usage_negative"),
    ({"modelUsage": {"m": {"inputTokens": 3}}}, "usage_missing_field"),
    ({"modelUsage": {"m": {"inputTokens": 3, "outputTokens": 1, "costUSD": -1}}}, "usage_negative"),
    ({"modelUsage": ["m"]}, "wrong_type"),
    ({"usage": {"input_tokens": 1.5, "output_tokens": 1}}, "usage_not_integer"),
])
def test_a_hostile_figure_on_a_result_or_cost_state_line_quarantines_it(fields, reason):
    assert reasons(events("claude-stream-json", _jsonl(result(**fields)))) == [reason]
    state = {("total_cost_usd" if k == "total_cost_usd" else k): v for k, v in fields.items() if k != "usage"}
    if state:
        renamed = {"totalCostUSD" if k == "total_cost_usd" else k: v for k, v in state.items()}
        assert reasons(events("claude-transcript", _jsonl(cost_state(**renamed)))) == [reason]


def test_stream_json_assistant_lines_give_no_usage():
    """Their ``usage`` is the stream's first snapshot (``output_tokens`` 1, and no
    ``requestId`` to share the transcript's key): the result line counts the query."""
    line = {"type": "assistant", "session_id": SESSION, "uuid": "a1",
            "message": {"id": "msg_01", "content": [{"type": "text", "text": "hi"}],
                        "usage": {"input_tokens": 103, "output_tokens": 1}}}
    assert not [e for e in events("claude-stream-json", _jsonl(line)) if isinstance(e, (Usage, UsageReported))]


def _jsonl(*records: dict) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)
