"""The built-in usage report: a thread's UTC day cost over $20, or its last response
filling 90% of the context window, is a notice without any rule, once per crossing,
with the figure; [defaults] usage_report = false turns it off."""

import calendar
import logging

from tests.controller.test_notify import _append, _look, _sent
from tests.rules.test_budget import Prices
from tillerman.controller.notify.notices import Notifier
from tillerman.controller.notify.usage_report import UsageReport
from tillerman.ledger.events import Usage
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.usage import Tokens
from tillerman.rules.config import load_effective
from tillerman.rules.notify import NotifySink

DAY = calendar.timegm((2026, 6, 13, 9, 0, 0))
NEXT_DAY = DAY + 86400
SINK = NotifySink(name="pager", command=("true",), group_window=0.0)


def _usage(rec, n, at, input, window=None, thread="T"):
    # the test table: $1 per 1,000 input tokens
    _append(rec, Usage(thread_id=thread, turn_id="u1", source_kind="codex_live", model="m", response_key=f"r{n}",
                       tokens=Tokens(input=input), context_window=window), f"usage{n}", at)


def _bodies(handovers):
    return [(h.keys, notice) for h in handovers for notice in h.payload()["notices"]]


def test_a_day_over_twenty_dollars_is_told_once_with_its_figure_and_a_new_day_again():
    rec, notifier = MemoryRecorder(), Notifier([SINK], UsageReport(Prices()))
    _usage(rec, 1, DAY, 15_000)
    assert _look(rec, notifier, DAY + 1) == []  # $15: under
    _usage(rec, 2, DAY + 10, 6_000)
    (keys, body), = _bodies(handovers := _look(rec, notifier, DAY + 11))
    assert keys == ("usage:T:cost_usd:2026-06-13@cost_usd",)
    assert {k: body[k] for k in ("kind", "measure", "figure", "limit", "day", "resolved")} == {
        "kind": "usage", "measure": "cost_usd", "figure": 21.0, "limit": 20.0, "day": "2026-06-13", "resolved": False}
    _sent(rec, handovers, DAY + 11)
    _usage(rec, 3, DAY + 20, 9_000)  # still over: no storm
    assert _look(rec, notifier, DAY + 21) == []
    _usage(rec, 4, NEXT_DAY, 25_000)  # a new UTC day, crossed again
    (handover,) = _look(rec, notifier, NEXT_DAY + 1)  # one thread's notices: one hand-over
    assert sorted(handover.keys) == ["usage:T:cost_usd:2026-06-13@resolved", "usage:T:cost_usd:2026-06-14@cost_usd"]


def test_ninety_percent_of_the_context_is_told_once_per_crossing():
    rec, notifier = MemoryRecorder(), Notifier([SINK], UsageReport(Prices()))
    _usage(rec, 1, DAY, 850, window=1000)
    assert _look(rec, notifier, DAY + 1) == []
    _usage(rec, 2, DAY + 5, 920, window=1000)
    (keys, body), = _bodies(handovers := _look(rec, notifier, DAY + 6))
    assert keys == ("usage:T:context:2@context",) and (body["figure"], body["last_input"], body["context_window"]) == (
        0.92, 920, 1000)
    _sent(rec, handovers, DAY + 6)
    _usage(rec, 3, DAY + 7, 950, window=1000)  # still over
    assert _look(rec, notifier, DAY + 8) == []
    _usage(rec, 4, DAY + 9, 300, window=1000)  # compacted: under again, the notice resolves
    ((keys, body),) = _bodies(handovers := _look(rec, notifier, DAY + 10))
    assert keys == ("usage:T:context:2@resolved",) and body["settled"] == "context_below"
    _sent(rec, handovers, DAY + 10)
    _usage(rec, 5, DAY + 11, 990, window=1000)
    assert [k for k, _ in _bodies(_look(rec, notifier, DAY + 12))] == [("usage:T:context:7@context",)]  # the row's seq


def test_without_a_sink_for_usage_the_crossing_is_logged_once(caplog):
    rec, notifier = MemoryRecorder(), Notifier([], UsageReport(Prices()))
    with caplog.at_level(logging.WARNING, logger="tillerman"):
        _usage(rec, 1, DAY, 21_000)
        _look(rec, notifier, DAY + 1)
        _usage(rec, 2, DAY + 2, 1_000)
        _look(rec, notifier, DAY + 3)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("usage:")]
    assert "spent $21.00 on 2026-06-13 (UTC), over $20 a day" in line and "usage_report = false" in line


def test_one_config_line_turns_it_off(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[defaults]\nusage_report = false\n")
    assert load_effective(None, config).usage_report is False and load_effective(None, None).usage_report is True
    rec, notifier = MemoryRecorder(), Notifier([SINK], None)  # what the daemon runs with then
    _usage(rec, 1, DAY, 50_000, window=1000)
    assert _look(rec, notifier, DAY + 1) == []
