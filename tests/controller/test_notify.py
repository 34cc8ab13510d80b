"""Notices for people (tillerman.controller.notify.notices): each overdue intent, escalation and
report once per step, grouped per thread within a window, optionally repeated, and
resolved once when it settles, also across a restart (what was sent is read back from
the ledger). The sinks (tillerman.controller.notify.sinks) retry with backoff and record
every attempt."""

import http.server
import json
import logging
import threading

import anyio
import pytest

from tillerman.controller.core import intent_requests
from tillerman.controller.notify import sinks as notify_sinks
from tillerman.controller.notify.notices import Notifier
from tillerman.controller.notify.sinks import SinkRunner
from tillerman.ledger import projections
from tillerman.ledger.events import (
    DecisionRecorded,
    Envelope,
    NotificationFailed,
    NotificationSent,
    Report,
    TurnCompleted,
    TurnStarted,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.notify import NotifySink

SINK = NotifySink(name="pager", command=("true",), group_window=10.0)


def _overdue(rec, thread="T", deadline=10.0, now=0.0):
    return intent_requests.propose(rec, now=now, thread_id=thread, mode="queue", text="later",
                                   ack_deadline=deadline, owner="ann")


def _look(rec, notifier: Notifier, now: float):
    """What the daemon does each round: fold the new rows, ask what is due."""
    for entry in rec.read(after_seq=notifier.state.seq):
        notifier.fold(entry)
    return notifier.due(projections.load(rec), now)


def _sent(rec, handovers, now: float) -> None:
    """A sink took each hand-over: recorded as the runner records it."""
    rec.append([Envelope(event_id=f"sent:{now}:{i}", source="tillerman", at=now, event=NotificationSent(
        thread=h.thread_id, sink=h.sink.name, keys=h.keys)) for i, h in enumerate(handovers)])


def _append(rec, event, event_id, at):
    rec.append([Envelope(event_id=event_id, event=event, source="tillerman", at=at)])


def test_an_overdue_intent_is_sent_once_after_the_window_then_resolved_once():
    rec = MemoryRecorder()
    intent = _overdue(rec)
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 5.0) == []  # not due yet
    assert _look(rec, notifier, 20.0) == [] and notifier.next_due() == 30.0  # the window opened
    (first,) = _look(rec, notifier, 30.0)
    assert first.keys == (f"overdue:{intent.id}@ack",) and first.thread_id == "T"
    body = first.payload()["notices"][0]
    assert (body["intent"], body["kind"], body["step"], body["resolved"]) == (intent.id, "overdue", "ack", False)
    assert _look(rec, notifier, 31.0) == []  # in flight: never handed over twice
    _sent(rec, [first], 31.0)
    assert _look(rec, notifier, 100.0) == []  # sent, still overdue, no repeat
    intent_requests.transition(rec, intent.id, State.EXPIRED, "cancelled")
    _look(rec, notifier, 101.0)
    (resolved,) = _look(rec, notifier, 111.0)
    notice = resolved.payload()["notices"][0]
    assert resolved.keys == (f"overdue:{intent.id}@resolved",)
    assert (notice["resolved"], notice["settled"], notice["state"]) == (True, "expired", "expired")
    _sent(rec, [resolved], 112.0)
    assert _look(rec, notifier, 500.0) == [] and notifier.state.alerts == {}  # nothing left to say or keep


def test_notices_of_one_thread_within_the_window_go_together():
    rec = MemoryRecorder()
    a, b = _overdue(rec, "T", 10.0), _overdue(rec, "T", 14.0)
    c = _overdue(rec, "U", 12.0)
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 12.0) == []  # T's window opens at 12 (a), U's at 12 (c)
    assert _look(rec, notifier, 15.0) == []  # b joins T's open window
    handovers = _look(rec, notifier, 22.0)
    assert [(h.thread_id, h.keys) for h in handovers] == [
        ("T", (f"overdue:{a.id}@ack", f"overdue:{b.id}@ack")), ("U", (f"overdue:{c.id}@ack",))]


@pytest.mark.parametrize("moves", [
    ((State.DISPATCH_UNKNOWN, "dispatching"), (State.QUEUED, "accepted"), (State.ACKNOWLEDGED, "echo")),
    ((State.EXPIRED, "cancelled"),),
])
def test_an_intent_no_longer_overdue_before_its_window_closed_is_not_sent(moves):
    rec = MemoryRecorder()
    intent = _overdue(rec)
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 20.0) == []  # overdue: the window opens
    for state, reason in moves:
        intent_requests.transition(rec, intent.id, state, reason)
    assert _look(rec, notifier, 25.0) == [] and _look(rec, notifier, 40.0) == []
    assert notifier.state.alerts == {}


def test_repeat_sends_an_unresolved_step_again():
    rec = MemoryRecorder()
    _overdue(rec)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=1.0, repeat=3600.0)])
    _look(rec, notifier, 20.0)
    (first,) = _look(rec, notifier, 21.0)
    _sent(rec, [first], 21.0)
    assert _look(rec, notifier, 3000.0) == [] and notifier.next_due() == 3621.0
    _look(rec, notifier, 3621.0)
    (again,) = _look(rec, notifier, 3622.0)
    assert again.keys == first.keys and again.payload()["notices"][0]["repeat"] is True


def test_each_overdue_intent_gets_exactly_one_resolved_notice_across_a_restart(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        intent = _overdue(rec)
        before = Notifier([SINK])
        _look(rec, before, 20.0)
        (first,) = _look(rec, before, 30.0)
        _sent(rec, [first], 30.0)
        _look(rec, before, 31.0)
        before.save(rec)  # the heartbeat's snapshot; rows after it are read on load
        intent_requests.transition(rec, intent.id, State.EXPIRED, "cancelled")
    for restart in range(2):  # a restart after the snapshot, then one after the resolution
        with SQLiteRecorder(path) as rec:
            after = Notifier([SINK])
            after.load(rec)
            after.drop_settled(projections.load(rec))
            _look(rec, after, 200.0)
            handovers = _look(rec, after, 210.0)
            if restart == 0:
                assert [h.keys for h in handovers] == [(f"overdue:{intent.id}@resolved",)]  # not the step again
                _sent(rec, handovers, 210.0)
            else:
                assert handovers == []


def test_an_escalation_is_notified_with_its_resolution_when_it_settled_within_the_window():
    rec = MemoryRecorder()
    intent = _overdue(rec, deadline=1000.0)
    _append(rec, DecisionRecorded(thread_id="T", intent_id=intent.id, action="escalate", reason="no_grant"),
            "d1", 1.0)
    notifier = Notifier([NotifySink(name="n", command=("true",), kinds=("escalation",))])
    assert _look(rec, notifier, 1.0) == []
    intent_requests.transition(rec, intent.id, State.REJECTED, "no_grant")
    (handover,) = _look(rec, notifier, 11.0)
    (notice,) = handover.payload()["notices"]
    assert handover.keys == (f"escalation:{intent.id}@no_grant", f"escalation:{intent.id}@resolved")
    assert (notice["kind"], notice["reason"], notice["settled"]) == ("escalation", "no_grant", "rejected")


def test_a_review_that_held_an_intent_is_told_to_its_owner_as_an_escalation_then_resolved():
    rec = MemoryRecorder()
    intent = _overdue(rec, deadline=1000.0)
    view = projections.load(rec).intents[intent.id]
    rec.append([intent_requests.evidence_envelope(intent, view.state, "review_held", {
        "checkpoint": "before_dispatch", "reviewer": "codex", "outcome": "review_failed:timeout",
        "disposition": None}, "review:cp1", 1.0)])
    notifier = Notifier([NotifySink(name="n", command=("true",), kinds=("escalation",))])
    assert _look(rec, notifier, 1.0) == []  # the window is open
    (held,) = _look(rec, notifier, 11.0)
    (notice,) = held.payload()["notices"]
    assert held.keys == (f"escalation:{intent.id}@review_held:before_dispatch",)
    assert (notice["kind"], notice["reviewer"], notice["outcome"]) == ("escalation", "codex", "review_failed:timeout")
    _sent(rec, [held], 11.0)
    intent_requests.transition(rec, intent.id, State.REJECTED, "review_failed", at=20.0)
    assert _look(rec, notifier, 30.0) == []  # a new group's window opens
    (resolved,) = _look(rec, notifier, 40.0)
    assert resolved.keys == (f"escalation:{intent.id}@resolved",)


def test_a_report_for_a_person_resolves_when_its_turn_ends_and_shadow_or_observe_ones_are_not_sent():
    rec = MemoryRecorder()
    _append(rec, TurnStarted(thread_id="T", turn_id="t1"), "ts", 0.0)
    for event_id, detail in (("report:stall", {"action": "report_overdue", "status": "active"}),
                             ("report:shadow", {"action": "report_overdue", "shadow": True}),
                             ("report:observe", {"action": "observe"})):
        _append(rec, Report(thread_id="T", turn_id="t1", rule_id="stall", rule_version=1, finding="quiet 10m",
                            detail=detail), event_id, 600.0)
    notifier = Notifier([NotifySink(name="n", command=("true",), group_window=1.0, kinds=("report",))])
    _look(rec, notifier, 600.0)
    (handover,) = _look(rec, notifier, 601.0)
    assert handover.keys == ("report:report:stall@1",)
    assert handover.payload()["notices"][0]["finding"] == "quiet 10m"
    _sent(rec, [handover], 601.0)
    assert _look(rec, notifier, 700.0) == []
    _append(rec, TurnCompleted(thread_id="T", turn_id="t1"), "tc", 800.0)
    _look(rec, notifier, 800.0)
    (resolved,) = _look(rec, notifier, 801.0)
    assert resolved.keys == ("report:report:stall@resolved",)
    assert resolved.payload()["notices"][0]["settled"] == "turn_ended"


def test_a_retried_failure_stays_in_flight_and_a_final_one_is_not_sent_again():
    rec = MemoryRecorder()
    _overdue(rec)
    notifier = Notifier([SINK])
    _look(rec, notifier, 20.0)
    (handover,) = _look(rec, notifier, 30.0)
    _append(rec, NotificationFailed(thread="T", sink="pager", keys=handover.keys, error="exited 1",
                                    retry_in=2.0), "f1", 30.0)
    assert _look(rec, notifier, 40.0) == [] and _look(rec, notifier, 60.0) == []
    _append(rec, NotificationFailed(thread="T", sink="pager", keys=handover.keys, error="exited 1",
                                    retry_in=None), "f2", 60.0)
    assert _look(rec, notifier, 70.0) == [] and _look(rec, notifier, 90.0) == []  # given up on: not resent


def test_a_settled_subject_nobody_was_told_of_is_not_sent_after_a_start():
    rec = MemoryRecorder()
    intent = _overdue(rec, deadline=1000.0)
    _append(rec, DecisionRecorded(thread_id="T", intent_id=intent.id, action="escalate", reason="no_grant"),
            "d1", 1.0)
    intent_requests.transition(rec, intent.id, State.REJECTED, "no_grant")
    notifier = Notifier([SINK])
    notifier.load(rec)  # a sink added to a ledger with history
    notifier.drop_settled(projections.load(rec))
    assert _look(rec, notifier, 100.0) == [] and _look(rec, notifier, 200.0) == []


def test_without_sinks_overdue_intents_are_only_logged(caplog):
    rec = MemoryRecorder()
    intent = _overdue(rec)
    caplog.set_level(logging.INFO, logger="tillerman")
    notifier = Notifier([])
    assert _look(rec, notifier, 20.0) == [] and _look(rec, notifier, 30.0) == []
    assert caplog.text.count(f"overdue: intent {intent.id}") == 1
    intent_requests.transition(rec, intent.id, State.EXPIRED, "cancelled")
    _look(rec, notifier, 31.0)
    assert f"resolved: overdue intent {intent.id} settled as expired" in caplog.text


# -- the sinks --------------------------------------------------------------------------------


def _handover(rec, sink):
    _overdue(rec)
    notifier = Notifier([sink])
    at_once = _look(rec, notifier, 20.0)  # no window: handed over in the same round
    return at_once[0] if at_once else _look(rec, notifier, 20.0 + sink.group_window)[0]


def _outcomes(rec):
    return [e.envelope.event for e in rec.read() if isinstance(e.envelope.event, NotificationSent | NotificationFailed)]


def _deliver(rec, handover):
    runner = SinkRunner([handover.sink], rec, clock=lambda: 50.0, wake=lambda: None)
    anyio.run(runner.deliver, handover)


def test_a_command_sink_gets_the_group_as_json_on_stdin(tmp_path):
    out = tmp_path / "got.json"
    rec = MemoryRecorder()
    handover = _handover(rec, NotifySink(name="file", command=("sh", "-c", f"cat > {out}"), group_window=1.0))
    _deliver(rec, handover)
    got = json.loads(out.read_text())
    assert (got["sink"], got["thread"], len(got["notices"])) == ("file", "T", 1)
    (sent,) = _outcomes(rec)
    assert isinstance(sent, NotificationSent) and sent.keys == handover.keys and sent.attempt == 1


def test_on_overdue_gets_each_notice_alone_in_its_long_standing_shape(tmp_path):
    out = tmp_path / "got.json"
    rec = MemoryRecorder()
    handover = _handover(rec, NotifySink(name="on-overdue", shell=f"cat > {out}", group_window=0.0,
                                         kinds=("overdue",), per_notice=True))
    _deliver(rec, handover)
    got = json.loads(out.read_text())
    assert got["deadline"] == "ack" and got["resolved"] is False and "notices" not in got


@pytest.mark.parametrize(("command", "error"), [
    (("sh", "-c", "cat >/dev/null; echo broken >&2; exit 3"), "exited 3: broken"),
    (("sleep", "5"), "no answer within 0.2s; stopped it"),
    (("/nonexistent/notify",), "could not take the notices"),
])
def test_a_failing_or_hanging_sink_is_retried_with_backoff_then_given_up(monkeypatch, caplog, command, error):
    monkeypatch.setattr(notify_sinks, "MAX_ATTEMPTS", 3)
    monkeypatch.setattr(notify_sinks, "RETRY_FIRST", 0.01)
    rec = MemoryRecorder()
    handover = _handover(rec, NotifySink(name="bad", command=command, group_window=1.0, timeout=0.2))
    _deliver(rec, handover)
    outcomes = _outcomes(rec)
    assert [type(o) for o in outcomes] == [NotificationFailed] * 3
    assert [o.attempt for o in outcomes] == [1, 2, 3] and [o.retry_in for o in outcomes] == [0.01, 0.02, None]
    assert all(error in o.error for o in outcomes)
    assert "giving up on these notices" in caplog.text


def test_a_sink_backing_up_gives_up_on_new_notices_and_records_it(monkeypatch):
    monkeypatch.setattr(notify_sinks, "QUEUE", 1)
    rec = MemoryRecorder()
    handover = _handover(rec, NotifySink(name="slow", command=("true",), group_window=1.0))
    runner = SinkRunner([handover.sink], rec, clock=lambda: 50.0, wake=lambda: None)
    runner.hand([handover, handover])  # nothing takes them: the second finds the queue full
    (failed,) = _outcomes(rec)
    assert (failed.attempt, failed.retry_in, failed.keys) == (0, None, handover.keys)
    assert "already waiting" in failed.error


class _Hook(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    status = 200

    def do_POST(self):  # noqa: N802 (the stdlib's name)
        _Hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(_Hook.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    _Hook.bodies, _Hook.status = [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/tillerman"
    server.shutdown()


def test_a_webhook_sink_gets_the_group_posted_and_an_http_error_is_a_failure(monkeypatch, hook):
    monkeypatch.setattr(notify_sinks, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(notify_sinks, "RETRY_FIRST", 0.01)
    rec = MemoryRecorder()
    handover = _handover(rec, NotifySink(name="hook", webhook=hook, group_window=1.0))
    _deliver(rec, handover)
    assert _Hook.bodies[0]["notices"][0]["kind"] == "overdue" and isinstance(_outcomes(rec)[-1], NotificationSent)
    _Hook.status = 500
    _deliver(rec, handover)
    assert [o.error for o in _outcomes(rec)[1:]] == ["HTTP 500 Internal Server Error"] * 2


class _Elsewhere(http.server.BaseHTTPRequestHandler):
    """Stands for the host a redirect or a proxy would carry the notices to: any request
    it gets is a notice that left for where the config never named."""
    got: list = []

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        _Elsewhere.got.append(("GET", self.path))
        self.send_response(200)
        self.end_headers()

    def do_POST(self):  # noqa: N802
        _Elsewhere.got.append(("POST", self.path))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class _Redirecting(http.server.BaseHTTPRequestHandler):
    status = 302
    location = ""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(_Redirecting.status)
        self.send_header("Location", _Redirecting.location)
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve(handler):
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def elsewhere():
    _Elsewhere.got = []
    server = _serve(_Elsewhere)
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_webhook_redirect_is_a_failure_never_followed(monkeypatch, elsewhere, status):
    monkeypatch.setattr(notify_sinks, "MAX_ATTEMPTS", 1)
    _Redirecting.status, _Redirecting.location = status, f"http://{elsewhere}/stolen\x1b]52;c;aGk=\x07"
    server = _serve(_Redirecting)
    try:
        rec = MemoryRecorder()
        sink = NotifySink(name="hook", webhook=f"http://127.0.0.1:{server.server_address[1]}/t", group_window=1.0)
        _deliver(rec, _handover(rec, sink))
    finally:
        server.shutdown()
    (failed,) = _outcomes(rec)
    assert isinstance(failed, NotificationFailed) and _Elsewhere.got == []
    assert failed.error.startswith(f"HTTP {status} ") and "redirects are not followed" in failed.error
    assert f"http://{elsewhere}/stolen\\u001b]52;c;aGk=\\u0007" in failed.error and "\x1b" not in failed.error


def test_a_loopback_webhook_never_goes_through_a_proxy(monkeypatch, hook, elsewhere):
    monkeypatch.setenv("http_proxy", f"http://{elsewhere}")
    monkeypatch.setenv("no_proxy", "")
    rec = MemoryRecorder()
    _deliver(rec, _handover(rec, NotifySink(name="hook", webhook=hook, group_window=1.0)))
    assert isinstance(_outcomes(rec)[-1], NotificationSent) and len(_Hook.bodies) == 1 and _Elsewhere.got == []


def test_a_sinks_status_reason_is_shown_escaped(monkeypatch):
    assert notify_sinks._http_failure(500, "Oops\x1b[2J", None) == 'HTTP 500 "Oops\\u001b[2J"'
