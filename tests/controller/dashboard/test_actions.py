"""The dashboard's actions record what the CLI records for the same request, and a
refused one records nothing."""

import time

import msgspec
import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests
from tillerman.controller.dashboard.actions import ACTIONS, TEXT_LIMIT, perform
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder

OWNER = "ana"
CREATED = 1000.0  # the seeded intent's proposal: its ack deadline (2m later) is long past


def seeded(path):
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"), source="appserver:x",
                             at=1.0)])
        intent_requests.propose(rec, now=CREATED, thread_id="T1", mode="queue", text="seeded", owner=OWNER,
                                intent_id="in-seeded")
        return rec.max_seq()


def new_events(path, after):
    """The events written after ``after``, without what differs between two writers
    of the same request: ids, times (a deadline is kept as its distance from the
    proposal: the defaults are what is compared)."""
    with SQLiteRecorder(path) as rec:
        return [_comparable(entry.envelope) for entry in rec.read(after_seq=after)]


def _comparable(env):
    data = msgspec.to_builtins(env.event)
    intent = data.get("intent")
    if intent is not None:
        created = intent.pop("created_at")
        for key in ("ack_deadline", "expires_at", "effect_deadline"):
            intent[key] = None if intent[key] is None else intent[key] - created
        for key in ("id", "text_digest"):
            intent.pop(key)
    data.pop("intent_id", None)
    return data


# action, form, the same request on the command line
HAPPY = [
    ("steer", {"thread": "T1", "text": "read src/ instead"},
     ["intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "steer",
      "--text", "read src/ instead", "--owner", OWNER]),
    ("steer", {"thread": "T1", "expected_turn": "U1", "text": "read src/ instead"},
     ["intent", "propose", "--thread", "T1", "--expected-turn", "U1", "--mode", "steer",
      "--text", "read src/ instead", "--owner", OWNER]),
    ("queue", {"thread": "T1", "text": "then run the tests"},
     ["intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "then run the tests", "--owner", OWNER]),
    ("interrupt", {"thread": "T1", "text": "wrong directory"},
     ["intent", "propose", "--thread", "T1", "--expected-turn", "active", "--mode", "interrupt",
      "--text", "wrong directory", "--owner", OWNER]),
    ("stop", {"thread": "T1", "text": "done for today"},
     ["intent", "propose", "--thread", "T1", "--mode", "stop", "--text", "done for today", "--owner", OWNER]),
    ("cancel", {"intent": "in-seeded"}, ["intent", "cancel", "in-seeded"]),
    ("resolve", {"subject": "overdue:in-seeded", "note": "seen"},
     ["overdue", "resolve", "in-seeded", "--note", "seen", "--by", OWNER]),
]


@pytest.mark.parametrize(("action", "form", "argv"), HAPPY, ids=[f"{c[0]}-{i}" for i, c in enumerate(HAPPY)])
def test_an_action_records_what_the_cli_records(tmp_path, action, form, argv):
    page, cli = tmp_path / "page.sqlite3", tmp_path / "cli.sqlite3"
    after = seeded(page)
    assert seeded(cli) == after
    with SQLiteRecorder(page) as rec:
        result = perform(rec, action, form, owner=OWNER, now=time.time())
    assert result.ok, result.message
    outcome = CliRunner().invoke(main, [*argv, "--ledger", str(cli)])
    assert outcome.exit_code == 0, outcome.output
    written = new_events(page, after)
    assert written and written == new_events(cli, after)


def test_every_action_has_a_case():
    assert {case[0] for case in HAPPY} | {"label"} == set(ACTIONS)


def test_a_label_records_what_tillerman_label_records(tmp_path):
    page, cli = tmp_path / "page.sqlite3", tmp_path / "cli.sqlite3"
    after = seeded(page)
    seeded(cli)
    with SQLiteRecorder(page) as rec:
        result = perform(rec, "label", {"subject": "intent:in-seeded", "verdict": "useful", "note": "right call"},
                         owner=OWNER, now=time.time())
    assert result.ok, result.message
    outcome = CliRunner().invoke(main, ["label", "intent:in-seeded", "useful", "--note", "right call",
                                        "--by", OWNER, "--ledger", str(cli)])
    assert outcome.exit_code == 0, outcome.output
    assert new_events(page, after) == new_events(cli, after)


REFUSED = [
    ("dance", {"thread": "T1"}, "unknown action 'dance'"),
    ("steer", {"text": "x"}, "the form has no thread"),
    ("steer", {"thread": "T1", "text": "  "}, "the form has no text"),
    ("steer", {"thread": "T1", "text": "x" * (TEXT_LIMIT + 1)}, f"at most {TEXT_LIMIT}"),
    ("steer", {"thread": "T9", "text": "x"}, "thread T9 has no active turn"),
    ("interrupt", {"thread": "T1\nT2", "text": "x"}, "--thread must be one line"),
    ("queue", {"thread": "T1", "text": 7}, "the form's text is not text"),
    ("cancel", {"intent": "in-nope"}, "no intent in-nope in this ledger"),
    ("cancel", {}, "the form has no intent"),
    ("resolve", {"subject": "in-seeded"}, "give overdue:INTENT"),
    ("resolve", {"subject": "escalation:in-seeded"}, "give overdue:INTENT"),
    ("resolve", {"subject": "overdue:in-nope"}, "no intent in-nope"),
]


@pytest.mark.parametrize(("action", "form", "message"), REFUSED)
def test_a_refusal_says_why_and_writes_nothing(tmp_path, action, form, message):
    path = tmp_path / "page.sqlite3"
    after = seeded(path)
    with SQLiteRecorder(path) as rec:
        result = perform(rec, action, form, owner=OWNER, now=time.time())
        assert rec.max_seq() == after
    assert not result.ok and message in result.message and "\n" not in result.message


def test_a_cancelled_intent_cannot_be_cancelled_or_resolved_again(tmp_path):
    path = tmp_path / "page.sqlite3"
    seeded(path)
    with SQLiteRecorder(path) as rec:
        assert perform(rec, "cancel", {"intent": "in-seeded"}, owner=OWNER, now=time.time()).ok
        after = rec.max_seq()
        again = perform(rec, "cancel", {"intent": "in-seeded"}, owner=OWNER, now=time.time())
        resolve = perform(rec, "resolve", {"subject": "overdue:in-seeded"}, owner=OWNER, now=time.time())
        assert rec.max_seq() == after
    assert not again.ok and "only a proposed intent can be cancelled" in again.message
    assert not resolve.ok and "waits on no deadline" in resolve.message


def test_a_notice_not_overdue_yet_or_resolved_already_is_refused(tmp_path):
    path = tmp_path / "page.sqlite3"
    seeded(path)
    with SQLiteRecorder(path) as rec:
        early = perform(rec, "resolve", {"subject": "overdue:in-seeded"}, owner=OWNER, now=CREATED + 1)
        assert perform(rec, "resolve", {"subject": "overdue:in-seeded"}, owner=OWNER, now=CREATED + 200).ok
        after = rec.max_seq()
        twice = perform(rec, "resolve", {"subject": "overdue:in-seeded"}, owner="bo", now=CREATED + 300)
        assert rec.max_seq() == after
    assert not early.ok and "is not overdue" in early.message
    assert not twice.ok and "resolved by ana" in twice.message
