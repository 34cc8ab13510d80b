"""Token figures: one model response's usage, whatever the source wrote, counted one way.

The counting rule (docs/design.md "The usage account"): cached input is part of
input, reasoning part of output, and neither is ever added a second time; a response's
total is ``input + output``. Every source maps its own names onto ``Tokens`` here, and
every number is checked on the way in: usage comes from files and messages anyone can
write, so a negative count, a fraction, a string, a number past any real response, or
figures that contradict each other are refused with a reason (the caller quarantines the
record) and never become a 0 in a total.

Pure: no I/O. The sources in ``tillerman.monitor`` call the ``*_tokens`` readers; the
account, the usage command and the budget rules add ``Tokens`` together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

#: No single response comes near this (the largest context windows are ~10^6): a count
#: above it is a forged or corrupt record, refused rather than added to a total.
MAX_RESPONSE_TOKENS = 10**9
#: A cumulative counter (a thread's running total) may be far larger, not unboundedly so.
MAX_TOTAL_TOKENS = 10**15


class UsageRefused(ValueError):
    """A usage record that cannot be counted. ``reason`` is the quarantine reason
    (``usage_negative``, ``usage_not_integer``, ``usage_out_of_range``,
    ``usage_missing_field``, ``usage_inconsistent``); ``field`` names the figure."""

    def __init__(self, reason: str, field: str, value: Any = None) -> None:
        super().__init__(f"{reason}: {field}={value!r}")
        self.reason = reason
        self.field = field


class Tokens(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One response's (or a sum of responses') token figures. ``cached_input`` and
    ``cache_write`` are parts of ``input``; ``cache_write_1h`` is the part of
    ``cache_write`` written for an hour; ``reasoning`` is part of ``output``."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    cache_write_1h: int = 0
    output: int = 0
    reasoning: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output

    @property
    def uncached_input(self) -> int:
        """Input neither read from nor written to a cache (Anthropic's ``input_tokens``)."""
        return self.input - self.cached_input - self.cache_write

    # Written out field by field: an account adds Tokens several times per response, and
    # this is about five times faster than a loop over the fields (``tillerman usage``).
    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(input=self.input + other.input, cached_input=self.cached_input + other.cached_input,
                      cache_write=self.cache_write + other.cache_write,
                      cache_write_1h=self.cache_write_1h + other.cache_write_1h,
                      output=self.output + other.output, reasoning=self.reasoning + other.reasoning)

    def __sub__(self, other: Tokens) -> Tokens:
        return Tokens(input=self.input - other.input, cached_input=self.cached_input - other.cached_input,
                      cache_write=self.cache_write - other.cache_write,
                      cache_write_1h=self.cache_write_1h - other.cache_write_1h,
                      output=self.output - other.output, reasoning=self.reasoning - other.reasoning)

    def is_zero(self) -> bool:
        # Written out for the same reason: the report asks it of every response it prices.
        return not (self.input or self.cached_input or self.cache_write or self.cache_write_1h or self.output
                    or self.reasoning)


FIELDS: tuple[str, ...] = Tokens.__struct_fields__
ZERO = Tokens()


def count(value: Any, field: str, *, limit: int = MAX_RESPONSE_TOKENS) -> int:
    """A token count as a source wrote it, or ``UsageRefused``: an ``int`` (JSON integer;
    not a bool, a float such as ``5.0`` or ``NaN``, nor a numeric string) in 0..limit."""
    if value.__class__ is int and 0 <= value <= limit:  # the usual case first: every figure of every response
        return value
    if value is None:
        raise UsageRefused("usage_missing_field", field, value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageRefused("usage_not_integer", field, value)
    if value < 0:
        raise UsageRefused("usage_negative", field, value)
    if value > limit:
        raise UsageRefused("usage_out_of_range", field, value)
    return value


def _optional(record: Mapping[str, Any], key: str, *, limit: int) -> int:
    """An optional figure: absent (or JSON null) means 0, as the APIs mean it."""
    value = record.get(key)
    if value is None:
        return 0
    if value.__class__ is int and 0 <= value <= limit:  # count()'s usual case, without the call: every figure read
        return value
    return count(value, key, limit=limit)


def _required(record: Mapping[str, Any], key: str, *, limit: int) -> int:
    return count(record.get(key), key, limit=limit)


def _consistent(tokens: Tokens) -> Tokens:
    if tokens.cached_input + tokens.cache_write > tokens.input:
        raise UsageRefused("usage_inconsistent", "cached_input", tokens.cached_input + tokens.cache_write)
    if tokens.cache_write_1h > tokens.cache_write:
        raise UsageRefused("usage_inconsistent", "cache_write_1h", tokens.cache_write_1h)
    if tokens.reasoning > tokens.output:
        raise UsageRefused("usage_inconsistent", "reasoning", tokens.reasoning)
    return tokens


#: Codex's breakdown names: the app-server's (camelCase) and a rollout's (snake_case).
CODEX_LIVE_NAMES = ("inputTokens", "cachedInputTokens", "cacheWriteInputTokens", "outputTokens",
                    "reasoningOutputTokens", "totalTokens")
CODEX_ROLLOUT_NAMES = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens",
                       "reasoning_output_tokens", "total_tokens")


def codex_tokens(breakdown: Any, names: tuple[str, ...] = CODEX_LIVE_NAMES, *,
                 limit: int = MAX_RESPONSE_TOKENS) -> Tokens:
    """A Codex token breakdown (``last``/``total`` of ``thread/tokenUsage/updated``, or
    ``last_token_usage``/``total_token_usage`` of a rollout's ``token_count`` with
    ``CODEX_ROLLOUT_NAMES``). Codex counts cached input inside input and reasoning inside
    output already; a ``totalTokens`` that is not ``input + output`` is inconsistent.
    Give ``limit=MAX_TOTAL_TOKENS`` for a cumulative ``total``."""
    if not isinstance(breakdown, Mapping):
        raise UsageRefused("usage_missing_field", "breakdown", breakdown)
    inp, cached, write, out, reasoning, total = names
    tokens = _consistent(Tokens(
        input=_required(breakdown, inp, limit=limit),
        cached_input=_optional(breakdown, cached, limit=limit),
        cache_write=_optional(breakdown, write, limit=limit),
        output=_required(breakdown, out, limit=limit),
        reasoning=_optional(breakdown, reasoning, limit=limit),
    ))
    stated = breakdown.get(total)
    if stated is not None and count(stated, total, limit=2 * limit) != tokens.total:
        raise UsageRefused("usage_inconsistent", total, stated)
    return tokens


def difference(later: Tokens, earlier: Tokens, field: str) -> Tokens:
    """The figures a cumulative counter rose by (one response's, where the source wrote
    only the counter), or ``UsageRefused``: a counter that went down, or a rise that is
    no response's (more cached input than input), cannot be read as one; ``field``
    names the counter."""
    rise = later - earlier
    if any(getattr(rise, name) < 0 for name in FIELDS):
        raise UsageRefused("usage_inconsistent", field, rise)
    return _consistent(rise)


def codex_response_key(thread_id: str | None, total: Tokens) -> str | None:
    """The key one Codex response is counted by: its thread and the thread's cumulative
    counters after it. The app-server's ``thread/tokenUsage/updated`` and the rollout's
    ``token_count`` of one response share it (the account counts it once), and a
    repeated report of an unchanged total (Codex writes one when only its rate limits
    changed) is the same response. None without a thread: nothing to join."""
    if thread_id is None:
        return None
    return f"{thread_id}:" + ":".join(str(getattr(total, name)) for name in FIELDS)


def claude_tokens(usage: Any, *, limit: int = MAX_RESPONSE_TOKENS) -> Tokens:
    """An Anthropic ``usage`` object (a transcript's ``message.usage``, stream-json's
    ``usage``). ``input_tokens`` there is the uncached part: input here adds the cache
    reads and writes to it. Cache writes are the 5-minute and 1-hour breakdown when
    ``cache_creation`` has one (as ccusage reads them), else ``cache_creation_input_tokens``;
    a breakdown that disagrees with that total is inconsistent. Give
    ``limit=MAX_TOTAL_TOKENS`` for a sum of responses (a stream-json ``result``'s)."""
    if not isinstance(usage, Mapping):
        raise UsageRefused("usage_missing_field", "usage", usage)
    uncached = _required(usage, "input_tokens", limit=limit)
    read = _optional(usage, "cache_read_input_tokens", limit=limit)
    created = _optional(usage, "cache_creation_input_tokens", limit=limit)
    write, write_1h = created, 0
    tiers = usage.get("cache_creation")
    if isinstance(tiers, Mapping) and ("ephemeral_5m_input_tokens" in tiers or "ephemeral_1h_input_tokens" in tiers):
        write_1h = _optional(tiers, "ephemeral_1h_input_tokens", limit=limit)
        write = _optional(tiers, "ephemeral_5m_input_tokens", limit=limit) + write_1h
        if "cache_creation_input_tokens" in usage and usage["cache_creation_input_tokens"] is not None and write != created:
            raise UsageRefused("usage_inconsistent", "cache_creation", write)
    details = usage.get("output_tokens_details")
    reasoning = _optional(details, "thinking_tokens", limit=limit) if isinstance(details, Mapping) else 0
    return _consistent(Tokens(input=uncached + read + write, cached_input=read, cache_write=write,
                              cache_write_1h=write_1h, output=_required(usage, "output_tokens", limit=limit),
                              reasoning=reasoning))
