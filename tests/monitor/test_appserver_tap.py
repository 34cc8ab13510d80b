"""The tap's subscriptions: the user's threads are resumed at their first ``active``;
Codex's ephemeral housekeeping threads (the TUI's title generation) are recorded and
never subscribed to, and no rule ever looks at them."""

from __future__ import annotations

from tillerman.ledger.events import Entry
from tillerman.ledger.projections import Projection
from tillerman.monitor.appserver_tap import AppServerTap, resume_wakes_nothing
from tillerman.monitor.jsonrpc import Notification
from tillerman.rules.detect import detect, next_due
from tillerman.rules.files import default_ruleset

TITLE = {"id": "t-title", "ephemeral": True, "threadSource": "thread_title", "path": None}
USER = {"id": "t-user", "ephemeral": False, "threadSource": "user"}


def _note(method: str, params: dict) -> Notification:
    return Notification(method=method, params=params, raw={"method": method, "params": params, "emittedAtMs": 1000})


def _active(thread_id: str) -> Notification:
    return _note("thread/status/changed", {"threadId": thread_id, "status": {"type": "active", "activeFlags": []}})


def _fold(envelopes) -> Projection:
    return Projection().fold(Entry(seq=i + 1, envelope=e, prev_hash="", hash="") for i, e in enumerate(envelopes))


def test_an_ephemeral_thread_is_recorded_and_never_resumed():
    tap = AppServerTap("unix:///s")
    started = tap.receive(_note("thread/started", {"thread": TITLE}), 1.0)
    assert [e.event.ephemeral for e in started.envelopes] == [True]
    assert tap.receive(_active("t-title"), 1.1).resume == []
    assert tap.users_work("t-title") is False


def test_the_users_thread_is_resumed_at_its_first_active():
    tap = AppServerTap("unix:///s")
    tap.receive(_note("thread/started", {"thread": USER}), 1.0)
    assert tap.receive(_active("t-user"), 1.1).resume == ["t-user"]
    assert tap.users_work("t-user") is True and tap.users_work("unseen") is None


def test_a_thread_read_after_a_late_start_says_what_it_is_and_reads_again_identically():
    tap = AppServerTap("unix:///s")
    first = tap.read({"thread": TITLE})
    assert [e.event.thread_source for e in first] == ["thread_title"] and tap.users_work("t-title") is False
    assert tap.read({"thread": TITLE}) == first  # no time stamp: a re-read after a reconnect is a no-op
    assert tap.read({"nothing": 1}) == []


def test_no_rule_looks_at_a_housekeeping_thread():
    tap = AppServerTap("unix:///s")
    envelopes = [*tap.receive(_note("thread/started", {"thread": TITLE}), 1.0).envelopes,
                 *tap.receive(_note("turn/started", {"threadId": "t-title", "turn": {"id": "u1"}}), 1.0).envelopes]
    projection = _fold(envelopes)
    snapshot = projection.snapshot("t-title")
    assert not snapshot.supervised and snapshot.active_turn_id == "u1"
    ruleset = default_ruleset()
    assert detect(snapshot, 1e9, ruleset) == [] and next_due(snapshot, 2.0, ruleset) is None
    # the same thread as the user's work would be looked at (the stall rule's timer runs)
    user = _fold([*AppServerTap("unix:///s").receive(_note("turn/started", {"threadId": "t-title",
                                                                             "turn": {"id": "u1"}}), 1.0).envelopes])
    assert next_due(user.snapshot("t-title"), 2.0, ruleset) is not None


def test_only_a_thread_running_a_turn_may_be_resumed():
    """On an idle thread a resume starts the thread's active goal's next turn."""
    assert resume_wakes_nothing("active")
    assert not any(resume_wakes_nothing(status) for status in ("idle", "systemError", "notLoaded", None))


def test_an_idle_thread_left_unsubscribed_is_followed_and_resumed_at_its_next_active():
    tap = AppServerTap("unix:///s")
    tap.read({"thread": USER})
    assert tap.loaded(["t-user"]) == ["t-user"]
    tap.subscribe_when_active("t-user")  # idle when the daemon attached
    assert tap.following() == {"t-user"}  # still this daemon's thread (leases)
    assert tap.receive(_active("t-user"), 1.0).resume == ["t-user"]
    assert tap.receive(_active("t-user"), 1.1).resume == []  # asked once per connection
    tap.connected()
    assert tap.following() == frozenset()


def test_the_goal_of_a_thread_left_unsubscribed_is_read_as_a_resume_would_say_it():
    tap = AppServerTap("unix:///s")
    [read] = tap.goal({"goal": {"threadId": "t-user", "objective": "o", "status": "active", "tokensUsed": 5}}, 2.0)
    assert (read.event.thread_id, read.event.status, read.event.tokens_used, read.at) == ("t-user", "active", 5, 2.0)
    assert tap.goal({"goal": None}, 2.0) == []  # no goal: nothing known of one before
