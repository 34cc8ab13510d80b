"""One duration syntax for the command line and the rule files, and one way to print it."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tillerman.rules.durations import MAX_DURATION, check_duration, format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400),
    ("1.5h", 5400), ("0.5s", 0.5), ("250ms", 0.25), ("1ms", 0.001),
    ("1h30m", 5400), ("1d2h3m4s5ms", 93784.005),
    ("366d", MAX_DURATION), ("8784h", MAX_DURATION),
])
def test_a_duration_is_numbers_and_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [
    "10", 600, 1.5, None, "", "soon", "10 minutes", "5 m", " 5m", "5m ", "5M", "5min", "-5m", "+5m", "1e3s",
    ".5s", "5.s", "30m1h", "5m5m", "1h 30m", "infs", "nans",
])
def test_anything_else_is_refused_with_how_to_write_it(text: object) -> None:
    with pytest.raises(ValueError, match=r"^invalid duration .*; write a number and a unit, like 90s, 5m, 1.5h, 1h30m"
                                         r" or 250ms$"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0s", "0ms", "0.0004s", "0d0h"])
def test_zero_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not positive \(the shortest is 1ms\)"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["367d", "8785h", "366d1ms", "31622401s", "9" * 400 + "s", "99999999999d"])
def test_beyond_366_days_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"is too long; at most 366d$"):
        parse_duration(text)


def test_the_message_names_what_was_given() -> None:
    with pytest.raises(ValueError, match=r'^invalid --ack-deadline "soon"; write'):
        parse_duration("soon", name="--ack-deadline")


@pytest.mark.parametrize(("seconds", "problem"), [
    (math.nan, "not a finite duration"), (math.inf, "too long"), (-math.inf, "not positive"), (-1.0, "not positive"),
    (True, "not a finite duration"),
])
def test_a_computed_duration_is_checked_the_same_way(seconds: float, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_duration(seconds, "--expires")


def test_a_duration_is_kept_to_the_millisecond() -> None:
    assert check_duration(1.0004) == 1.0 and check_duration(1.0006) == 1.001


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.25, "250ms"), (1.5, "1s500ms"), (90, "1m30s"), (600, "10m"), (5400, "1h30m"), (86400, "1d"),
    (93784.005, "1d2h3m4s5ms"), (MAX_DURATION, "366d"),
])
def test_the_formatter_writes_largest_units_first(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [(754.25, "12m34s"), (3605, "1h5s"), (119.9, "1m59s"), (0.5, "500ms")])
def test_a_shortened_duration_keeps_its_largest_parts(seconds: float, text: str) -> None:
    assert format_duration(seconds, parts=2) == text


@given(st.integers(min_value=1, max_value=int(MAX_DURATION * 1000)))
def test_what_is_written_reads_back_the_same(milliseconds: int) -> None:
    seconds = milliseconds / 1000
    assert parse_duration(format_duration(seconds)) == seconds
