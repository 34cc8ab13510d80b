"""Token figures as the sources write them: every hostile number is refused with its reason
(docs/design.md "Hostile numbers"), valid ones read back as written, and sums behave."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tillerman.ledger.usage import (
    CODEX_ROLLOUT_NAMES, MAX_RESPONSE_TOKENS, MAX_TOTAL_TOKENS, ZERO, Tokens, UsageRefused, claude_tokens,
    codex_tokens,
)

CODEX = {"inputTokens": 100, "cachedInputTokens": 40, "cacheWriteInputTokens": 10, "outputTokens": 30,
         "reasoningOutputTokens": 5, "totalTokens": 130}
CLAUDE = {"input_tokens": 5, "cache_read_input_tokens": 40, "cache_creation_input_tokens": 10, "output_tokens": 30,
          "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 6}}
#: What JSON decoding gives for the literals a hostile file may hold.
HUGE = json.loads("1" + "0" * 400)
NAN, INFINITY = json.loads("NaN"), json.loads("Infinity")


def codex_with(**changes):
    return {**CODEX, **changes}


def claude_with(**changes):
    return {**CLAUDE, **changes}


def without(record, key):
    return {k: v for k, v in record.items() if k != key}


HOSTILE = [
    # (what, reader, record, reason, field)
    ("negative", codex_tokens, codex_with(outputTokens=-1), "usage_negative", "outputTokens"),
    ("negative (Claude)", claude_tokens, claude_with(cache_read_input_tokens=-5), "usage_negative",
     "cache_read_input_tokens"),
    ("fraction", codex_tokens, codex_with(inputTokens=100.5), "usage_not_integer", "inputTokens"),
    ("integral float", claude_tokens, claude_with(output_tokens=30.0), "usage_not_integer", "output_tokens"),
    ("NaN", codex_tokens, codex_with(inputTokens=NAN), "usage_not_integer", "inputTokens"),
    ("Infinity", claude_tokens, claude_with(input_tokens=INFINITY), "usage_not_integer", "input_tokens"),
    ("numeric string", codex_tokens, codex_with(outputTokens="30"), "usage_not_integer", "outputTokens"),
    ("numeric string (Claude)", claude_tokens, claude_with(input_tokens="5"), "usage_not_integer", "input_tokens"),
    ("bool", codex_tokens, codex_with(cachedInputTokens=True), "usage_not_integer", "cachedInputTokens"),
    ("10^400", codex_tokens, codex_with(inputTokens=HUGE), "usage_out_of_range", "inputTokens"),
    ("above 10^9 for one response", claude_tokens, claude_with(output_tokens=MAX_RESPONSE_TOKENS + 1),
     "usage_out_of_range", "output_tokens"),
    ("null required", codex_tokens, codex_with(outputTokens=None), "usage_missing_field", "outputTokens"),
    ("missing required", claude_tokens, without(CLAUDE, "input_tokens"), "usage_missing_field", "input_tokens"),
    ("not an object", codex_tokens, [1, 2], "usage_missing_field", "breakdown"),
    ("not an object (Claude)", claude_tokens, "usage", "usage_missing_field", "usage"),
    ("cached > input", codex_tokens, codex_with(cachedInputTokens=95), "usage_inconsistent", "cached_input"),
    ("reasoning > output", codex_tokens, codex_with(reasoningOutputTokens=31), "usage_inconsistent", "reasoning"),
    ("5m + 1h != cache creation", claude_tokens,
     claude_with(cache_creation={"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 7}),
     "usage_inconsistent", "cache_creation"),
    ("totalTokens != input + output", codex_tokens, codex_with(totalTokens=131), "usage_inconsistent",
     "totalTokens"),
]


@pytest.mark.parametrize("reader,record,reason,field", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_figures_are_refused_with_their_reason(reader, record, reason, field):
    with pytest.raises(UsageRefused) as refused:
        reader(record)
    assert (refused.value.reason, refused.value.field) == (reason, field)


def test_a_cumulative_counter_may_pass_one_responses_limit_not_the_totals():
    big = codex_with(inputTokens=MAX_RESPONSE_TOKENS + 1, totalTokens=MAX_RESPONSE_TOKENS + 31)
    assert codex_tokens(big, limit=MAX_TOTAL_TOKENS).input == MAX_RESPONSE_TOKENS + 1
    with pytest.raises(UsageRefused, match="usage_out_of_range"):
        codex_tokens(codex_with(inputTokens=MAX_TOTAL_TOKENS + 1), limit=MAX_TOTAL_TOKENS)


def test_absent_optional_figures_are_zero_as_the_apis_mean_it():
    assert codex_tokens({"inputTokens": 7, "outputTokens": 3}) == Tokens(input=7, output=3)
    assert claude_tokens({"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": None}) == Tokens(
        input=7, output=3)


def test_claude_input_adds_the_cache_reads_and_writes_to_the_uncached_part():
    tokens = claude_tokens(CLAUDE)
    assert tokens == Tokens(input=55, cached_input=40, cache_write=10, cache_write_1h=6, output=30)
    assert tokens.uncached_input == 5 and tokens.total == 85


# -- valid figures round-trip; sums are associative and commutative ---------------------

figures = st.builds(
    lambda cached, write, write_1h, extra, reasoning, more: Tokens(
        input=cached + write + extra, cached_input=cached, cache_write=write, cache_write_1h=min(write_1h, write),
        output=reasoning + more, reasoning=reasoning),
    *[st.integers(0, MAX_RESPONSE_TOKENS // 4)] * 6)


@given(figures)
def test_valid_codex_figures_round_trip(tokens):
    names = CODEX_ROLLOUT_NAMES
    record = dict(zip(names, (tokens.input, tokens.cached_input, tokens.cache_write, tokens.output,
                              tokens.reasoning, tokens.total), strict=True))
    assert codex_tokens(record, names) == msgspec.structs.replace(tokens, cache_write_1h=0)


@given(figures)
def test_valid_claude_figures_round_trip(tokens):
    record = {"input_tokens": tokens.uncached_input, "cache_read_input_tokens": tokens.cached_input,
              "cache_creation_input_tokens": tokens.cache_write, "output_tokens": tokens.output,
              "cache_creation": {"ephemeral_5m_input_tokens": tokens.cache_write - tokens.cache_write_1h,
                                 "ephemeral_1h_input_tokens": tokens.cache_write_1h},
              "output_tokens_details": {"thinking_tokens": tokens.reasoning}}
    assert claude_tokens(record) == tokens


@given(figures, figures, figures)
def test_sums_are_associative_and_commutative(a, b, c):
    assert (a + b) + c == a + (b + c)
    assert a + b == b + a
    assert a + ZERO == a and (a + b) - b == a
    assert (a + b).total == a.total + b.total
