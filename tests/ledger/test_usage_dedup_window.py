"""The budget fold's de-duplication keeps a bounded window: keys of responses two UTC
days older than the newest are forgotten, and a report that late is not charged, so the
projection's snapshot does not grow with every response ever counted while a duplicate
arriving in time still counts once."""

from __future__ import annotations

import calendar

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tillerman.ledger import events as ev
from tillerman.ledger.projections import Projection
from tillerman.ledger.usage import Tokens
from tillerman.ledger.usage_account import KEPT_DAYS, Dedup

DAY = calendar.timegm((2026, 6, 13, 0, 0, 0))
HOUR = 3600.0


def claude(n: int, at: float, *, thread: str = "t", copy: int = 0, output: int = 10,
           sidechain: bool = False) -> ev.Envelope:
    event = ev.Usage(thread_id=thread, turn_id=f"turn-{int(at // HOUR)}", source_kind="claude_transcript", model="m",
                     message_id=f"msg_{n:030d}", request_id=f"req_{n:030d}", sidechain=sidechain,
                     tokens=Tokens(input=100, output=output))
    return ev.Envelope(event_id=f"c{n}:{copy}:{output}", event=event, source="claude:x", at=at)


def codex(n: int, at: float, *, copy: int = 0) -> ev.Envelope:
    event = ev.Usage(thread_id="x", turn_id=f"turn-{int(at // HOUR)}", source_kind="codex_live", model="m",
                     response_key=f"x:{n}", tokens=Tokens(input=50, output=5))
    return ev.Envelope(event_id=f"x{n}:{copy}", event=event, source="appserver:x", at=at)


def fold(envelopes) -> Projection:
    projection = Projection()
    for seq, env in enumerate(envelopes, 1):
        projection.apply_envelope(env, seq)
    return projection


def kept(dedup: Dedup) -> int:
    return len(dedup.response_keys) + len(dedup.by_request)


def days_of_responses(days: int, per_hour: int) -> list[ev.Envelope]:
    """``per_hour`` Claude and Codex responses an hour for ``days`` days, each reported twice."""
    out = []
    for n in range(days * 24 * per_hour):
        at = DAY + n * HOUR / per_hour
        out += [claude(n, at), claude(n, at + 1, copy=1), codex(n, at), codex(n, at + 1, copy=1)]
    return out


def test_the_kept_keys_and_the_snapshot_do_not_grow_with_the_responses():
    short, long = fold(days_of_responses(3, 10)), fold(days_of_responses(30, 10))
    # ten times the responses, ended turns and days long past: the same window is kept
    assert kept(long.usage_dedup) == kept(short.usage_dedup) <= KEPT_DAYS * 24 * 10 * 2
    assert len(msgspec.msgpack.encode(long.usage_dedup)) == len(msgspec.msgpack.encode(short.usage_dedup))
    # and each response was still counted once
    assert long.threads["t"].usage.thread.responses == 30 * 24 * 10
    assert long.threads["x"].usage.thread.responses == 30 * 24 * 10


def test_a_copy_within_the_window_counts_once_and_a_later_copy_is_not_charged():
    # yesterday's response copied today (a resumed session) is still known; one from two
    # days before the newest falls in no budget window left and is not charged at all
    projection = fold([claude(1, DAY), claude(2, DAY + 2 * 86400 - HOUR),
                       claude(1, DAY, copy=1, thread="resumed"),
                       claude(3, DAY + 2 * 86400), claude(1, DAY, copy=2, thread="late"),
                       claude(2, DAY + 2 * 86400 - HOUR, copy=1, thread="resumed")])
    assert projection.threads["t"].usage.thread.responses == 3
    assert projection.threads["resumed"].usage is None
    assert projection.threads["late"].usage is None


def test_a_better_copy_within_the_window_still_replaces_the_earlier_one():
    projection = fold([claude(1, DAY + 20 * HOUR), claude(2, DAY + 30 * HOUR),
                       claude(1, DAY + 20 * HOUR, copy=1, output=900)])
    figures = projection.threads["t"].usage
    assert (figures.thread.responses, figures.thread.tokens.output) == (2, 910)


def test_a_winner_of_a_later_day_is_forgotten_with_its_own_day():
    # a sidechain copy kept on day 0 is replaced on day 1 by the main thread's copy (another
    # request id): day 0 leaving the window must not forget the winner
    side = claude(1, DAY, thread="side", sidechain=True)
    main = ev.Envelope(event_id="main", source="claude:x", at=DAY + 86400, event=msgspec.structs.replace(
        side.event, thread_id="main", sidechain=False, request_id="req_main"))
    projection = fold([side, main, claude(9, DAY + 2 * 86400)])
    assert len(projection.usage_dedup.by_request) == 2  # the winner and the new response
    again = msgspec.structs.replace(main, event_id="main again")
    projection.apply_envelope(again, 4)
    assert projection.threads["main"].usage.thread.responses == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.floats(0, 36 * HOUR)), min_size=1, max_size=30),
       st.randoms(use_true_random=False), st.booleans())
def test_any_interleaving_of_copies_counts_as_each_response_once(responses, random, snapshot):
    # Every copy carries its response's time; copies arrive in any order, at any point
    # after the response (up to a day and a half: within the window).
    responses = {n: at for n, at in responses}
    once = [claude(n, DAY + at) for n, at in sorted(responses.items(), key=lambda r: r[1])]
    copies = [claude(n, DAY + at, copy=c) for n, at in responses.items() for c in range(3)]
    copies.sort(key=lambda env: env.at)
    random.shuffle(copies)  # then any interleaving
    projection = Projection()
    for seq, env in enumerate(copies, 1):
        if snapshot and seq == len(copies) // 2:
            projection = msgspec.msgpack.decode(msgspec.msgpack.encode(projection), type=Projection)
        projection.apply_envelope(env, seq)
    expected = fold(once).threads["t"].usage.thread
    assert projection.threads["t"].usage.thread.tokens == expected.tokens
    assert projection.threads["t"].usage.thread.responses == expected.responses == len(responses)


def test_a_forged_far_future_time_does_not_stop_later_responses_from_being_charged():
    """A transcript line anyone can write, dated in the year 9999: seen now, it is charged
    now, and the window stays where the responses are."""
    forged = msgspec.structs.replace(claude(1, calendar.timegm((9999, 1, 1, 0, 0, 0))), observed_at=DAY + HOUR)
    later = [msgspec.structs.replace(claude(n, DAY + n * HOUR), observed_at=DAY + n * HOUR + 1) for n in (2, 3)]
    projection = fold([forged, *later])
    assert projection.threads["t"].usage.thread.tokens.total == 3 * 110  # the forged one, then both later


def test_copies_of_one_response_on_two_days_are_remembered_until_the_later_day_leaves():
    """One response's copies can straddle UTC midnight (Claude Code writes a line per
    content block; Codex's live notification and its rollout record): its key is kept
    until the later day leaves the window, so a session resumed then, copying the later
    line, does not count it again."""
    midnight = DAY + 86400
    other_day = DAY + 2 * 86400 + HOUR  # a response on day 2 moves the window past day 0
    first, later = claude(1, midnight - 1), claude(1, midnight + 1, copy=1)
    resumed = msgspec.structs.replace(claude(1, midnight + 1, copy=2),
                                      event=msgspec.structs.replace(later.event, thread_id="resumed"))
    projection = fold([first, later, claude(9, other_day), resumed])
    assert projection.threads["resumed"].usage is None  # a copy: not charged again
    x = fold([codex(1, midnight - 0.1), codex(1, midnight + 0.2, copy=1), codex(2, other_day),
              codex(1, midnight + 0.2, copy=2)])
    assert x.threads["x"].usage.thread.responses == 2


def test_a_winner_is_remembered_as_long_as_the_copy_it_replaced():
    """A sidechain copy seen on day 1, then the main thread's copy of that message (its own
    request id) dated day 0 replaces it; the sidechain line copied again on day 1, once
    the window left day 0, is still a copy."""
    midnight = DAY + 86400
    side = claude(1, midnight + 1, sidechain=True)
    main = msgspec.structs.replace(claude(1, midnight - 1, copy=1),
                                   event=msgspec.structs.replace(side.event, request_id="req_main", sidechain=False))
    again = msgspec.structs.replace(claude(1, midnight + 1, copy=2, sidechain=True),
                                    event=msgspec.structs.replace(side.event, thread_id="resumed"))
    projection = fold([side, main, claude(9, DAY + 2 * 86400 + HOUR), again])
    assert projection.threads["resumed"].usage is None
