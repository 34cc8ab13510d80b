"""A person resolving an overdue notice (tillerman.controller.core.notice_resolution):
``overdue`` no longer lists it, the notifier sends its sinks the resolution once and
repeats it no more, also after a restart, and a deadline missed later is a new notice.
Notices link to the thread's page when the dashboard's address is configured."""

import json
import logging

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests, notice_resolution
from tillerman.controller.core.overdue import overdue
from tillerman.controller.notify.notices import Notifier
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope, NotificationSent
from tillerman.ledger.intent_states import State
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective
from tillerman.rules.errors import RuleSetError
from tillerman.rules.notify import NotifySink

SINK = NotifySink(name="pager", command=("true",), group_window=10.0)
REPEATING = NotifySink(name="pager", command=("true",), group_window=10.0, repeat=60.0)


def _overdue(rec, **extra):
    """A queued message proposed at 0, its acknowledgement due at 10."""
    return intent_requests.propose(rec, now=0.0, thread_id="T", mode="queue", text="later", ack_deadline=10.0,
                                   owner="ann", **extra)


def _look(rec, notifier, now):
    for entry in rec.read(after_seq=notifier.state.seq):
        notifier.fold(entry)
    return notifier.due(projections.load(rec), now)


def _sent(rec, handovers, now):
    rec.append([Envelope(event_id=f"sent:{now}:{i}", source="tillerman", at=now, event=NotificationSent(
        thread=h.thread_id, sink=h.sink.name, keys=h.keys)) for i, h in enumerate(handovers)])


def _told(rec, notifier, now):
    """The notice due after the group window, sent."""
    _look(rec, notifier, now)
    handovers = _look(rec, notifier, now + 10.0)
    _sent(rec, handovers, now + 10.0)
    return handovers


@pytest.mark.parametrize("sink", [SINK, REPEATING], ids=["once", "repeating"])
def test_a_resolved_notice_is_sent_resolved_once_and_never_repeated(sink):
    rec = MemoryRecorder()
    intent = _overdue(rec)
    notifier = Notifier([sink])
    (first,) = _told(rec, notifier, 20.0)
    assert first.keys == (f"overdue:{intent.id}@ack",)
    notice_resolution.resolve(rec, intent.id, by="ana", note="handled by hand", now=40.0)
    (resolved,) = _told(rec, notifier, 41.0)
    body = resolved.payload()["notices"][0]
    assert resolved.keys == (f"overdue:{intent.id}@resolved",)
    assert (body["resolved"], body["settled"], body["resolved_by"], body["resolution_note"]) == (
        True, "owner_resolved", "ana", "handled by hand")
    for now in (200.0, 1000.0, 5000.0):  # past any repeat
        assert _look(rec, notifier, now) == []
    assert notifier.overdue_now == 0  # no longer counted as overdue


def test_a_resolution_survives_a_restart(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        intent = _overdue(rec)
        before = Notifier([REPEATING])
        _told(rec, before, 20.0)
        before.save(rec)
        notice_resolution.resolve(rec, intent.id, by="ana", now=40.0)
    for restart in range(2):  # the resolution read back from the rows, then from the snapshot
        with SQLiteRecorder(path) as rec:
            after = Notifier([REPEATING])
            after.load(rec)
            after.drop_settled(projections.load(rec))
            handovers = _told(rec, after, 500.0 + restart)
            after.save(rec)
        assert [h.keys for h in handovers] == ([(f"overdue:{intent.id}@resolved",)] if restart == 0 else [])


def test_without_a_sink_a_resolved_intent_is_not_counted_overdue_after_a_restart(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        intent = _overdue(rec)
        notice_resolution.resolve(rec, intent.id, by="ana", now=40.0)
        notifier = Notifier([])
        notifier.load(rec)
        notifier.due(projections.load(rec), 50.0)
    assert notifier.overdue_now == 0


def test_a_notice_resolved_before_any_sink_was_told_is_not_sent():
    rec = MemoryRecorder()
    intent = _overdue(rec)
    notifier = Notifier([SINK])
    assert _look(rec, notifier, 20.0) == []  # the window opens
    notice_resolution.resolve(rec, intent.id, by="ana", now=25.0)
    assert _look(rec, notifier, 30.0) == [] and _look(rec, notifier, 60.0) == []


def test_a_deadline_missed_after_the_resolution_is_a_new_notice():
    rec = MemoryRecorder()
    intent = _overdue(rec, verify="test -f done")  # an effect deadline: 10 minutes after the proposal
    notifier = Notifier([SINK])
    _told(rec, notifier, 20.0)
    notice_resolution.resolve(rec, intent.id, by="ana", now=40.0)
    _told(rec, notifier, 41.0)
    for state, reason in ((State.DISPATCH_UNKNOWN, "dispatching"), (State.QUEUED, "accepted"),
                          (State.ACKNOWLEDGED, "echo")):
        intent_requests.transition(rec, intent.id, state, reason)
    assert _look(rec, notifier, 100.0) == []  # acknowledged, its effect not due yet
    (effect,) = _told(rec, notifier, 700.0)
    assert effect.keys == (f"overdue:{intent.id}@effect",)


def test_overdue_leaves_out_only_a_notice_resolved_after_its_deadline():
    rec = MemoryRecorder()
    intent = _overdue(rec)
    projection = projections.load(rec)
    subject = f"overdue:{intent.id}"
    assert [o.intent_id for o in overdue(projection, 20.0, {subject: 5.0})] == [intent.id]  # resolved before due
    assert overdue(projection, 20.0, {subject: 15.0}) == []


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    with SQLiteRecorder(path) as rec:
        intent = _overdue(rec)
    return intent.id


def _run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_the_cli_resolves_and_overdue_check_passes_after(ledger):
    assert _run("overdue", "--check", "--json")[0] == 1
    code, out = _run("overdue", "resolve", ledger, "--by", "ana", "--note", "seen", "--json")
    assert code == 0, out
    assert {k: v for k, v in json.loads(out).items() if k != "at"} == {
        "subject": f"overdue:{ledger}", "by": "ana", "note": "seen"}
    assert _run("overdue", "--check", "--json") == (0, "[]\n")


def test_the_cli_refuses_an_unknown_intent_with_exit_2(ledger):
    code, out = _run("overdue", "resolve", "in-nope")
    assert code == 2 and "no intent in-nope" in out


def test_resolving_twice_exits_1_and_says_who_did(ledger):
    assert _run("overdue", "resolve", ledger, "--by", "ana")[0] == 0
    code, out = _run("overdue", "resolve", ledger, "--by", "bo")
    assert code == 1 and "resolved by ana" in out


def test_the_groups_ledger_and_json_reach_resolve(ledger, tmp_path, monkeypatch):
    """`overdue --ledger L resolve ID` resolves in L: the group's --ledger was once parsed
    and dropped, and resolve wrote to the default ledger (or said there was none)."""
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(tmp_path / "elsewhere.sqlite3"))
    code, out = _run("overdue", "--ledger", str(path), "--json", "resolve", ledger, "--by", "ana")
    assert code == 0, out
    assert json.loads(out)["subject"] == f"overdue:{ledger}"
    assert not (tmp_path / "elsewhere.sqlite3").exists()
    assert _run("overdue", "--ledger", str(path), "--check", "--json") == (0, "[]\n")


@pytest.mark.parametrize("args", [["--now", "2026-12-01T00:00:00Z"], ["--check"]])
def test_listing_options_with_resolve_are_refused(ledger, args):
    code, out = _run("overdue", *args, "resolve", ledger)
    assert code == 2 and "for the listing" in out
    assert _run("overdue", "--check")[0] == 1  # nothing was resolved


def test_two_ledgers_named_are_refused(ledger, tmp_path):
    code, out = _run("overdue", "--ledger", str(tmp_path / "ledger.sqlite3"), "resolve", ledger,
                     "--ledger", str(tmp_path / "other.sqlite3"))
    assert code == 2 and "twice" in out


# -- links ------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "link"), [
    ("http://127.0.0.1:8765", "http://127.0.0.1:8765/thread/T%2F1"),
    ("https://box.tail.example/tm/", "https://box.tail.example/tm/thread/T%2F1"),
    # what tillerman dashboard prints: the page under its /d/PREFIX/ path
    ("http://127.0.0.1:8765/d/KnPyqjT1l9oNeB5KqiJuzA/", "http://127.0.0.1:8765/d/KnPyqjT1l9oNeB5KqiJuzA/thread/T%2F1"),
    (None, None),
])
def test_a_notice_links_to_its_threads_page_when_the_dashboard_is_configured(url, link):
    rec = MemoryRecorder()
    intent_requests.propose(rec, now=0.0, thread_id="T/1", mode="queue", text="later", ack_deadline=10.0)
    notifier = Notifier([SINK], dashboard_url=url)
    (handover,) = _told(rec, notifier, 20.0)
    assert handover.payload()["notices"][0].get("link") == link


def test_the_overdue_log_line_carries_the_link(caplog):
    rec = MemoryRecorder()
    _overdue(rec)
    with caplog.at_level(logging.WARNING, logger="tillerman"):
        _look(rec, Notifier([], dashboard_url="http://127.0.0.1:8765"), 20.0)
    assert "(http://127.0.0.1:8765/thread/T)" in caplog.text


CONFIG_HEAD = '[[notify]]\nname = "pager"\ncommand = ["true"]\n\n[dashboard]\n'


@pytest.mark.parametrize(("line", "url", "error"), [
    ('url = "http://127.0.0.1:8765"', "http://127.0.0.1:8765", None),
    ('url = "http://127.0.0.1:8765/d/KnPy/"', "http://127.0.0.1:8765/d/KnPy/", None),
    ("", None, None),
    ('url = "127.0.0.1:8765"', None, ":6: dashboard field url: invalid dashboard url"),
    ('url = "http://127.0.0.1:8765/?token=abc"', None, "carries credentials, a query or a fragment"),
    ('url = "http://me:pw@127.0.0.1:8765"', None, "carries credentials"),
    ('port = 8765', None, ":6: dashboard field port"),
])
def test_the_dashboard_url_setting(tmp_path, line, url, error):
    path = tmp_path / "config.toml"
    path.write_text(CONFIG_HEAD + line + "\n")
    path.chmod(0o600)
    if error is None:
        assert load_effective(None, path).dashboard_url == url
    else:
        with pytest.raises(RuleSetError, match=None) as caught:
            load_effective(None, path)
        assert error in str(caught.value), str(caught.value)
