"""Usage from the real Claude Code CLI 2.1.332 against the scripted Anthropic server,
which reports distinct figures per call (uncached input, cache reads, 5-minute and
1-hour cache writes, output): the transcript's per-response usage, summed per turn and
per thread, equals what the server reported, and so do the stream-json results and the
CLI's cumulative ``modelUsage`` (on the result lines and the transcript's cost-state).

Measured here too: the server puts placeholder input figures in ``message_start`` and
the real ones in ``message_delta``; the transcript still holds the real ones (2.1.332
writes each entry with the response's final usage), so the streaming placeholder of
ccusage issue #866 does not occur in its transcripts."""

from collections import defaultdict
from pathlib import Path

import pytest

from fixtures.anthropic_model import MODEL, AnthropicModel, ReportedUsage
from fixtures.claude_cli import ClaudeSession, is_result
from tests.monitor.support import parse
from tillerman.ledger.events import Usage, UsageReported
from tillerman.ledger.usage import ZERO, Tokens, claude_tokens

pytestmark = pytest.mark.live


def reported(n: int, *, placeholder: bool) -> ReportedUsage:
    full = {"input_tokens": 100 * n + 3, "cache_creation_input_tokens": 20 + 8 * n,
            "cache_read_input_tokens": 1000 * n,
            "cache_creation": {"ephemeral_5m_input_tokens": 20 + n, "ephemeral_1h_input_tokens": 7 * n}}
    if placeholder:
        return ReportedUsage(start={"input_tokens": 1, "output_tokens": 1}, final={**full, "output_tokens": 30 + n})
    return ReportedUsage(start={**full, "output_tokens": 1}, final={"output_tokens": 30 + n})


def server_tokens(usage: ReportedUsage) -> Tokens:
    """What one call reported, the delta's figures over the start's, as the API means them."""
    return claude_tokens({**usage.start, **usage.final})


@pytest.mark.parametrize("placeholder", [False, True], ids=["figures-at-start", "placeholder-at-start"])
def test_transcript_and_stream_json_usage_equal_the_servers(claude_cli: Path, tmp_path: Path, placeholder: bool):
    with AnthropicModel(usage=lambda n: reported(n, placeholder=placeholder)) as model:
        with ClaudeSession(claude_cli, tmp_path, model.base_url) as session:
            first = session.user("RUN: echo hi")  # two calls: the tool call, then the answer
            session.wait_for(is_result, timeout=90)
            second = session.user("hello there")
            session.wait_for(lambda line: is_result(line) and len(session.results()) >= 2, timeout=90)
            assert session.close(timeout=60) == 0
            calls = model.requests
            transcript = session.transcript.read_bytes()
    assert [c.number for c in calls] == [1, 2, 3]
    per_call = [server_tokens(c.usage) for c in calls]
    turns = {first: per_call[0] + per_call[1], second: per_call[2]}
    everything = sum(per_call, ZERO)

    events = [p.event for p in parse("claude-transcript", transcript, source=str(session.transcript))[0]]
    responses: dict[tuple, Usage] = {}
    for event in events:
        if isinstance(event, Usage):  # one entry per content block: one response, one key
            responses[(event.message_id, event.request_id)] = event
    assert [key[0] for key in responses] == ["msg_fake0001", "msg_fake0002", "msg_fake0003"]
    by_turn: dict[str, Tokens] = defaultdict(lambda: ZERO)
    for usage in responses.values():
        assert usage.model == MODEL
        by_turn[usage.turn_id] += usage.tokens
    assert dict(by_turn) == turns
    [state] = [e for e in events if isinstance(e, UsageReported)]
    assert state.source_kind == "claude_cost_state" and [m.tokens for m in state.models] == [everything]
    assert state.models[0].model == MODEL and state.cost_usd == state.models[0].cost_usd > 0

    stream = [p.event for p in parse("claude-stream-json", session.stdout_log.read_bytes())[0]]
    results = [e for e in stream if isinstance(e, UsageReported)]
    assert [(r.turn_id, r.tokens) for r in results] == list(turns.items())
    assert [m.tokens for m in results[-1].models] == [everything]  # cumulative, the latest
    assert results[-1].cost_usd == state.cost_usd
    assert not [e for e in stream if isinstance(e, Usage)]
