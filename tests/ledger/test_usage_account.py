"""The usage account: each response counted once, split per thread/turn/model/day, and the
two calculations (per-response sums against the cumulative counters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tillerman.ledger.events import Envelope, ModelUsage, Usage, UsageReported
from tillerman.ledger.usage import FIELDS, MAX_TOTAL_TOKENS, ZERO, Tokens, codex_response_key
from tillerman.ledger.usage_account import (
    BASELINE, COUNTER_RESET, GAP, PLACEHOLDER, UNTRANSCRIBED, Counted, Place, UsageAccount,
)
from tillerman.monitor.codex_rollout import token_count_usage

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
DAY = 1_780_000_000.0  # 2026-05-28 UTC
T10 = Tokens(input=10, output=5)
T20 = Tokens(input=20, output=5)


def claude(thread="s1", *, message_id="msg", request_id="req", tokens=T10, sidechain=False,
           speed=None, model="claude-sonnet-4-5", turn="t1", at=DAY, offset=0) -> Envelope:
    return Envelope(event_id=f"{thread}:{offset}", source=f"transcript:{thread}", at=at, offset=offset,
                    event=Usage(source_kind="claude_transcript", thread_id=thread, turn_id=turn, tokens=tokens,
                                model=model, message_id=message_id, request_id=request_id, sidechain=sidechain,
                                speed=speed))


def codex(tokens: Tokens, total: Tokens, *, thread="th", source="rollout", offset=0, turn="t1",
          window=None) -> Envelope:
    return Envelope(event_id=f"{source}:{offset}", source=source, at=DAY, offset=offset,
                    event=Usage(source_kind="codex_rollout" if source == "rollout" else "codex_live",
                                thread_id=thread, turn_id=turn, tokens=tokens, total=total, model="gpt-5.5",
                                context_window=window, response_key=codex_response_key(thread, total)))


def responses_with_counters(figures: list[Tokens], *, start: Tokens = ZERO, thread="th") -> list[Envelope]:
    envelopes, counter = [], start
    for offset, tokens in enumerate(figures):
        counter = counter + tokens
        envelopes.append(codex(tokens, counter, thread=thread, offset=offset))
    return envelopes


def fold(envelopes) -> UsageAccount:
    return UsageAccount().add_all(envelopes)


# -- counted once: Claude Code, as ccusage 20 deduplicates -----------------------------

DEDUP_CASES = [
    # (what, entries in order, the tokens counted)
    ("same message and request: one", [claude(), claude(offset=1)], T10),
    ("different request ids: both", [claude(), claude(request_id="req2", offset=1)], T10 + T10),
    ("no message id: never deduplicated", [claude(message_id=None), claude(message_id=None, offset=1)], T10 + T10),
    ("no request id keys on the message id alone",
     [claude(request_id=None), claude(request_id=None, offset=1)], T10),
    ("larger total replaces", [claude(), claude(tokens=T20, offset=1)], T20),
    ("smaller total loses", [claude(tokens=T20), claude(offset=1)], T20),
    ("same total: the one naming a speed replaces", [claude(), claude(speed="fast", offset=1)], T10),
    ("same total, both plain: the first stays", [claude(), claude(offset=1)], T10),
    ("across threads (files) too", [claude("a"), claude("b")], T10),
    ("sidechain replay under a new request id matches its parent by message id",
     [claude(), claude(request_id="replay", sidechain=True, tokens=T20, offset=1)], T10),
    ("a parent after its sidechain replay replaces it, though smaller",
     [claude(request_id="replay", sidechain=True, tokens=T20), claude(offset=1)], T10),
    ("two non-sidechain entries of one message with different requests both count",
     [claude(), claude(request_id="other", tokens=T20, offset=1)], T10 + T20),
]


@pytest.mark.parametrize("entries,expected", [case[1:] for case in DEDUP_CASES], ids=[c[0] for c in DEDUP_CASES])
def test_claude_dedup_follows_ccusage(entries, expected):
    assert fold(entries).tokens == expected


def test_a_losing_duplicate_changes_nothing():
    account = UsageAccount()
    account.add(claude(tokens=T20))
    assert account.add(claude(offset=1)) is None
    assert account.thread("s1").responses == 1


def test_a_replacement_in_place_counts_the_difference():
    account = UsageAccount()
    account.add(claude())
    counted = account.add(claude(tokens=T20, offset=1))
    assert counted == Counted(place=Place(thread_id="s1", turn_id="t1", model="claude-sonnet-4-5",
                                          day="2026-05-28"), delta=T20 - T10)
    assert account.thread("s1").tokens == T20
    assert account.thread("s1").responses == 1


def test_a_replacement_elsewhere_takes_the_old_figures_back_there():
    account = UsageAccount()
    account.add(claude("sub", request_id="replay", sidechain=True, tokens=T20, turn="x"))
    counted = account.add(claude("main", offset=1))
    assert counted.withdrawn == Place(thread_id="sub", turn_id="x", model="claude-sonnet-4-5", day="2026-05-28")
    assert (counted.delta, counted.withdrawn_tokens) == (T10, T20)
    assert account.thread("sub").tokens == ZERO and account.thread("sub").responses == 0
    assert account.thread("sub").by_turn == {"x": ZERO}
    assert account.thread("main").tokens == T10 and account.tokens == T10


def test_a_replaced_entry_is_found_by_the_winners_request_id():
    # ccusage moves the exact key to the winner: a later copy of the loser's request no
    # longer matches exactly and, being no sidechain, is counted on its own.
    account = fold([claude(request_id="replay", sidechain=True, tokens=T20), claude(offset=1), claude(offset=2),
                    claude(request_id="replay", offset=3)])
    assert account.tokens == T10 + T10


@given(st.permutations([claude(tokens=Tokens(input=10 * n, output=n), offset=n) for n in range(1, 5)]
                       + [claude(message_id="m2", tokens=Tokens(input=n, output=1), offset=10 + n)
                          for n in range(1, 4)]))
def test_claude_dedup_totals_do_not_depend_on_order(entries):
    # With distinct totals the winner is the largest, whatever came first.
    assert fold(entries).tokens == Tokens(input=40, output=4) + Tokens(input=3, output=1)


def test_the_fast_model_is_named_as_ccusage_names_it():
    account = fold([claude(speed="fast")])
    assert list(account.thread("s1").by_model) == ["claude-sonnet-4-5-fast"]


# -- counted once: Codex ---------------------------------------------------------------


def test_a_live_notification_and_its_rollout_record_count_once():
    live = codex(T10, T10, source="live")
    account = UsageAccount()
    assert isinstance(account.add(live), Counted)
    assert account.add(codex(T10, T10)) is None
    assert account.tokens == T10
    assert list(account.mismatches()) == []


# -- splits, context, activity ---------------------------------------------------------


def test_per_turn_model_day_and_context_use():
    a = codex(T10, T10, turn="t1", window=100)
    b = Envelope(event_id="b", source="rollout", at=DAY + 86_400, offset=9,
                 event=Usage(source_kind="codex_rollout", thread_id="th", turn_id="t2", tokens=T20, total=T10 + T20,
                             model="gpt-5.4", response_key=codex_response_key("th", T10 + T20)))
    thread = fold([a, b]).thread("th")
    assert thread.by_turn == {"t1": T10, "t2": T20}
    assert thread.by_model == {"gpt-5.5": T10, "gpt-5.4": T20}
    assert thread.by_day == {"2026-05-28": T10, "2026-05-29": T20}
    assert (thread.last_input, thread.context_window, thread.context_use) == (20, 100, 0.2)
    assert (thread.first_at, thread.last_at) == (DAY, DAY + 86_400)


def test_a_sum_past_the_sane_range_is_reported_out_of_range():
    big = Tokens(input=10**9, output=10**9)
    envelopes = [claude(message_id=None, tokens=big, offset=n) for n in range(MAX_TOTAL_TOKENS // 10**9 + 1)]
    thread = fold(envelopes).thread("s1")
    assert thread.out_of_range == ("input", "output", "total")
    assert fold(envelopes[:1]).thread("s1").out_of_range == ()


def test_usage_reported_is_kept_beside_never_added():
    report = Envelope(event_id="r", source="stream", event=UsageReported(
        source_kind="claude_stream", thread_id="s1", cost_usd=1.5))
    account = UsageAccount()
    assert account.add(report) is None
    assert account.tokens == ZERO and account.thread("s1").reported["claude_stream"] == report


# -- two calculations: Codex -----------------------------------------------------------

figures = st.builds(lambda cached, inp_extra, reasoning, out_extra: Tokens(
    input=cached + inp_extra, cached_input=cached, output=reasoning + out_extra, reasoning=reasoning),
    st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**5), st.integers(1, 10**5))
response_lists = st.lists(figures, min_size=2, max_size=12)


@given(response_lists)
def test_consistent_counters_agree_with_the_sum(responses):
    account = fold(responses_with_counters(responses))
    assert list(account.mismatches()) == []
    assert account.tokens == sum(responses, ZERO)


@given(response_lists, st.randoms())
def test_interleaved_sources_agree_in_any_order(responses, random):
    # The live stream and the rollout of one thread, merged in any order: linked by the
    # counters, not by arrival, so nothing is reported and each response counts once.
    live = [codex(e.event.tokens, e.event.total, source="live", offset=e.offset)
            for e in responses_with_counters(responses)]
    merged = live + responses_with_counters(responses)
    random.shuffle(merged)
    account = fold(merged)
    assert list(account.mismatches()) == []
    assert account.tokens == sum(responses, ZERO)


@given(response_lists, st.data())
def test_a_dropped_line_is_a_gap_at_its_place(responses, data):
    envelopes = responses_with_counters(responses)
    lost = data.draw(st.integers(1, len(envelopes) - 1), label="lost")
    kept = envelopes[:lost] + envelopes[lost + 1:]
    if lost == len(envelopes) - 1:
        assert list(fold(kept).mismatches()) == []  # the last line lost: nothing after it to tell
        return
    found = list(fold(kept).mismatches())
    after = envelopes[lost + 1]
    assert {m.cause for m in found} == {GAP}
    assert {(m.at_response, m.offset, m.after) for m in found} == {
        (after.event_id, after.offset, envelopes[lost - 1].event_id)}
    assert {m.field: m.difference for m in found} == _nonzero(responses[lost])


@given(response_lists, st.data())
def test_a_reset_counter_is_reported_where_it_went_down(responses, data):
    at = data.draw(st.integers(1, len(responses) - 1), label="reset at")
    envelopes = responses_with_counters(responses[:at]) + [
        codex(e.event.tokens, e.event.total, offset=e.offset + at) for e in responses_with_counters(responses[at:])]
    # A restarted counter that reads exactly as an earlier one has that response's key:
    # it is taken for the same response (the limit of keying Codex responses by counter).
    assume(len({e.event.response_key for e in envelopes}) == len(envelopes))
    found = list(fold(envelopes).mismatches())
    assert {m.cause for m in found} == {COUNTER_RESET}
    assert {m.at_response for m in found} == {envelopes[at].event_id}
    assert {m.field: m.difference for m in found} == {k: -v for k, v in _nonzero(sum(responses[:at], ZERO)).items()}


@given(response_lists, figures)
def test_a_counter_starting_above_its_first_response_is_a_baseline(responses, inherited):
    envelopes = responses_with_counters(responses, start=inherited)
    found = list(fold(envelopes).mismatches())
    assert {m.cause for m in found} == {BASELINE}
    assert {(m.at_response, m.after) for m in found} == {(envelopes[0].event_id, None)}
    assert {m.field: m.difference for m in found} == _nonzero(inherited)


def test_a_predecessor_arriving_late_resolves_the_finding():
    first, second = responses_with_counters([T10, T20])
    account = UsageAccount()
    account.add(second)
    assert {m.cause for m in account.mismatches()} == {BASELINE}
    account.add(first)
    assert list(account.mismatches()) == []


def _nonzero(tokens: Tokens) -> dict[str, int]:
    return {name: getattr(tokens, name) for name in FIELDS if getattr(tokens, name)}


# -- two calculations: Claude Code against the CLI's own figures -----------------------


def test_claude_transcript_against_model_usage():
    report = Envelope(event_id="cost", source="transcript:s1", offset=99, event=UsageReported(
        source_kind="claude_cost_state", thread_id="s1", models=(
            ModelUsage(model="claude-sonnet-4-5", tokens=Tokens(input=14, output=5)),
            ModelUsage(model="claude-haiku-4-5", tokens=Tokens(input=3, output=1)))))
    found = list(fold([claude(), report]).mismatches())
    assert [(m.model, m.field, m.expected, m.counter, m.difference, m.cause, m.offset) for m in found] == [
        ("claude-sonnet-4-5", "input", 10, 14, 4, PLACEHOLDER, 99),
        ("claude-haiku-4-5", "input", 0, 3, 3, UNTRANSCRIBED, 99),
        ("claude-haiku-4-5", "output", 0, 1, 1, UNTRANSCRIBED, 99),
    ]


def test_the_latest_report_is_the_one_compared():
    older = Envelope(event_id="r1", source="stream", event=UsageReported(
        source_kind="claude_stream", thread_id="s1", models=(ModelUsage(model="claude-sonnet-4-5", tokens=T20),)))
    newer = Envelope(event_id="r2", source="stream", event=UsageReported(
        source_kind="claude_stream", thread_id="s1", models=(ModelUsage(model="claude-sonnet-4-5", tokens=T10),)))
    assert list(fold([claude(), older, newer]).mismatches()) == []


# -- the seed's check on every recorded Codex rollout ----------------------------------

ROLLOUTS = sorted(p for p in FIXTURES.rglob("*.jsonl") if '"total_token_usage"' in p.read_text(errors="replace"))


def _rollout_usage(path: Path) -> list[Envelope]:
    envelopes, total, offset = [], None, 0
    for line in path.read_bytes().splitlines(keepends=True):
        record = json.loads(line) if line.strip() else {}
        payload = record.get("payload") if isinstance(record, dict) else None
        if record.get("type") == "event_msg" and isinstance(payload, dict) and payload.get("type") == "token_count":
            used = token_count_usage(payload, thread_id=path.name, turn_id=None, model=None, previous_total=total)
            if used is not None:
                total = used.total
                envelopes.append(Envelope(event_id=f"{path.name}:{offset}", source=str(path), offset=offset,
                                          event=used))
        offset += len(line)
    return envelopes


@pytest.mark.parametrize("path", ROLLOUTS, ids=[p.name for p in ROLLOUTS])
def test_deltas_agree_with_the_cumulative_counters_on_every_fixture(path):
    # Where a rollout writes no last_token_usage (the ccusage branch-history pair), the
    # response is the counter's rise and the check holds by construction; the recorded
    # 0.163 and 0.171 rollouts write both, and there it is the seed's check.
    envelopes = _rollout_usage(path)
    assert envelopes, "a fixture with token_count figures counts something"
    assert list(fold(envelopes).mismatches()) == []
