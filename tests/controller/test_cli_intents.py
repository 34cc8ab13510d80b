"""``tillerman intent …``, ``intents`` and ``overdue`` through the real command line."""

import json

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests as lib
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.owner import local_login


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"), source="appserver:x", at=1.0)])
    return path


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def propose(*extra):
    code, out = run("intent", "propose", "--thread", "T1", "--text", "Stop the grep; read src/ instead.", "--json", *extra)
    assert code == 0, out
    return json.loads(out)


def test_propose_resolves_active_turn_and_prints_the_contract_fields(ledger):
    data = propose("--expected-turn", "active", "--mode", "steer", "--ack-deadline", "90s", "--owner", "ana")
    assert data["expected_turn"] == "U1" and data["state"] == "proposed" and data["owner"] == "ana"
    for key in ("id", "thread", "mode", "ack_deadline", "effect_deadline", "expires_at"):
        assert key in data
    assert data["effect_deadline"] is None  # no check, no effect deadline
    assert data["client_user_message_id"] == f"tillerman-{data['id']}"


@pytest.mark.parametrize("user", ["someone-else", None])
def test_the_default_owner_is_the_login_name_not_user(ledger, monkeypatch, user):
    if user is None:
        monkeypatch.delenv("USER", raising=False)  # as in many containers and services
    else:
        monkeypatch.setenv("USER", user)
    data = propose("--expected-turn", "active", "--mode", "steer")
    assert data["owner"] == local_login()
    with SQLiteRecorder(ledger) as rec:
        assert lib.intent_view(rec, data["id"]).intent.producer == f"owner:{local_login()}"


def test_effect_deadline_defaults_when_a_check_is_set(ledger):
    data = propose("--mode", "queue", "--verify", "test -f done")
    assert data["effect_deadline"] is not None and data["expected_turn"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "steer"], "a steer needs --expected-turn"),
        (["--mode", "interrupt"], "a interrupt needs --expected-turn"),
        (["--mode", "steer", "--expected-turn", "U1", "--ack-deadline", "soon"], "invalid --ack-deadline \"soon\""),
        (["--mode", "queue", "--supersedes", "in-nope"], "--supersedes names no known intent"),
    ],
)
def test_bad_requests_exit_2_with_what_to_do(ledger, args, message):
    code, out = run("intent", "propose", "--thread", "T1", "--text", "x", *args)
    assert code == 2 and message in out


@pytest.mark.parametrize(("args", "stored"), [
    (["--mode", "interrupt", "--expected-turn", "U1", "--force"], {"force": True, "resume_queue": False}),
    (["--mode", "interrupt", "--expected-turn", "U1", "--resume-queue"], {"force": False, "resume_queue": True}),
    (["--mode", "steer", "--expected-turn", "U1", "--ack-token", "ACK-42"], {"ack_token": "ACK-42"}),
    (["--mode", "queue", "--ack-token", "ACK-42"], {"ack_token": "ACK-42", "force": False}),
])
def test_force_resume_queue_and_ack_token_are_recorded_on_the_intent(ledger, args, stored):
    data = propose(*args)
    assert {key: data[key] for key in stored} == stored
    with SQLiteRecorder(ledger) as rec:
        intent = lib.intent_view(rec, data["id"]).intent
    assert {key: getattr(intent, key) for key in stored} == stored  # what the daemon will read


@pytest.mark.parametrize(("args", "message"), [
    (["--mode", "steer", "--expected-turn", "U1", "--force"], "--force applies to --mode interrupt or stop only"),
    (["--mode", "stop", "--expected-turn", "U1"], "--expected-turn does not apply to --mode stop"),
    (["--mode", "stop", "--verify", "true"], "--expect and --verify do not apply to --mode stop"),
    (["--mode", "stop", "--ack-token", "ACK-42"], "--ack-token applies to --mode steer or queue (a stop"),
    (["--mode", "queue", "--resume-queue"], "--resume-queue applies to --mode interrupt only"),
    (["--mode", "interrupt", "--expected-turn", "U1", "--ack-token", "ACK-42"],
     "--ack-token applies to --mode steer or queue"),
    (["--mode", "steer", "--expected-turn", "U1", "--ack-token", " "], "--ack-token must be one line"),
    (["--mode", "queue", "--ack-token", "ACK\n42"], "--ack-token must be one line"),
])
def test_mode_options_outside_their_mode_exit_2_and_record_nothing(ledger, args, message):
    with SQLiteRecorder(ledger) as rec:
        before = rec.max_seq()
    code, out = run("intent", "propose", "--thread", "T1", "--text", "x", *args)
    assert code == 2 and message in out
    assert out.count("\n") == 1 and out.startswith("Error: ")  # one line
    with SQLiteRecorder(ledger) as rec:
        assert rec.max_seq() == before  # nothing written


def test_active_turn_required_when_none_is_active(ledger):
    code, out = run("intent", "propose", "--thread", "T9", "--text", "x", "--mode", "steer", "--expected-turn", "active")
    assert code == 2 and "no active turn" in out and "--mode queue" in out


def test_empty_text_is_refused(ledger):
    code, out = run("intent", "propose", "--thread", "T1", "--text", "  ", "--mode", "queue")
    assert code == 2 and "empty" in out


def test_cancel_then_cannot_cancel_again(ledger):
    data = propose("--mode", "queue")
    assert run("intent", "cancel", data["id"]) == (0, f"cancelled {data['id']}\n")
    code, out = run("intent", "cancel", data["id"])
    assert code == 1 and "is expired" in out
    shown = json.loads(run("intent", "show", data["id"], "--json")[1])
    assert shown["state"] == "expired"
    assert [(h["kind"], h["state"], h["reason"]) for h in shown["history"]] == [
        ("proposed", "proposed", "owner:" + shown["owner"]), ("transition", "expired", "cancelled")]


def test_cancel_explains_an_intent_under_delivery(ledger):
    data = propose("--mode", "queue")
    with SQLiteRecorder(ledger) as rec:
        lib.transition(rec, data["id"], State.DISPATCH_UNKNOWN, "dispatching")
    code, out = run("intent", "cancel", data["id"])
    assert code == 1 and "--supersedes" in out


def test_supersedes_expires_the_proposed_original(ledger):
    old = propose("--mode", "queue")
    new = propose("--mode", "queue", "--supersedes", old["id"])
    assert json.loads(run("intent", "show", old["id"], "--json")[1])["state"] == "expired"
    assert new["supersedes"] == old["id"]


def test_intents_lists_and_filters(ledger):
    a = propose("--mode", "queue")
    b = propose("--mode", "queue")
    run("intent", "cancel", a["id"])
    listed = json.loads(run("intents", "--json")[1])
    assert {i["id"] for i in listed} == {a["id"], b["id"]}
    assert [i["id"] for i in json.loads(run("intents", "--state", "expired", "--json")[1])] == [a["id"]]
    assert json.loads(run("intents", "--state", "queued", "--json")[1]) == []


def test_overdue_check_and_json(ledger):
    data = propose("--mode", "steer", "--expected-turn", "U1", "--ack-deadline", "1m")
    code, out = run("overdue", "--check", "--json", "--now", "2000-01-01T00:00:00Z")
    assert code == 0 and json.loads(out) == []
    code, out = run("overdue", "--check", "--json", "--now", "2099-01-01T00:00:00Z")
    assert code == 1
    (item,) = json.loads(out)
    assert item["intent"] == data["id"] and item["thread"] == "T1" and item["expected_turn"] == "U1"
    assert item["deadline"] == "ack" and item["state"] == "proposed" and item["why"]
    code, out = run("overdue", "--now", "2099-01-01T00:00:00Z")
    assert code == 0 and data["id"] in out and "AGE" in out


def test_overdue_bad_time_is_usage_error(ledger):
    code, out = run("overdue", "--now", "yesterday")
    assert code == 2 and "ISO-8601" in out


def test_show_unknown_intent(ledger):
    code, out = run("intent", "show", "in-00000000000000000000")
    assert code == 2 and "no intent" in out


@pytest.mark.parametrize("request_", [{"mode": "steer", "expected_turn": "U1"}, {"mode": "queue"},
                                      {"mode": "queue", "supersedes": "first"}])
def test_a_proposal_naming_its_turn_folds_no_ledger_rows(ledger, monkeypatch, request_):
    """Only 'active' needs the thread's fold; a superseded intent is read from its own rows."""
    with SQLiteRecorder(ledger) as rec:
        lib.propose(rec, thread_id="T1", mode="queue", text="first", intent_id="first")

        def refused(*args, **kwargs):
            raise AssertionError("the proposal folded the ledger")

        monkeypatch.setattr(rec, "read", refused)
        monkeypatch.setattr(lib.projections, "load", refused)
        intent = lib.propose(rec, thread_id="T1", text="second", **request_)
        assert rec.intent_entries(intent.id)
        if "supersedes" in request_:
            assert lib.intent_view(rec, "first").state == State.EXPIRED


def _goal(ledger, status: str) -> None:
    from tillerman.ledger.events import GoalUpdated

    with SQLiteRecorder(ledger) as rec:
        rec.append([Envelope(event_id=f"goal-{status}", event=GoalUpdated(thread_id="T1", status=status),
                             source="appserver:x", at=2.0)])


def test_a_stop_names_no_turn_and_always_has_an_effect_deadline(ledger):
    data = propose("--mode", "stop")
    assert (data["mode"], data["expected_turn"]) == ("stop", None)
    assert data["effect_deadline"] is not None  # its effect is always read back


@pytest.mark.parametrize(("extra", "warning"), [
    ((), "the interrupt ends one turn and the goal's next turn follows; --mode stop pauses the goal as well"),
    (("--resume-queue",), "--resume-queue resumes the goal's turns too"),
])
def test_an_interrupt_on_a_goal_thread_warns_that_the_work_goes_on(ledger, extra, warning):
    _goal(ledger, "active")
    code, out = run("intent", "propose", "--thread", "T1", "--text", "x", "--mode", "interrupt",
                    "--expected-turn", "U1", *extra)
    assert code == 0 and f"warning: thread T1 has an active goal: {warning}" in out


def test_an_interrupt_on_a_thread_whose_goal_is_paused_says_nothing_of_goals(ledger):
    _goal(ledger, "paused")
    code, out = run("intent", "propose", "--thread", "T1", "--text", "x", "--mode", "interrupt", "--expected-turn", "U1")
    assert code == 0 and "goal" not in out


def test_intent_show_warns_when_the_interrupt_left_the_goal_active(ledger):
    data = propose("--mode", "interrupt", "--expected-turn", "U1")
    with SQLiteRecorder(ledger) as rec:
        lib.transition(rec, data["id"], State.DISPATCH_UNKNOWN, "dispatching", {"attempt": "a1"})
        lib.transition(rec, data["id"], State.ACKNOWLEDGED, "turn_interrupted",
                       {"turn_id": "U1", "turn_status": "interrupted", "goal_active": True})
    code, out = run("intent", "show", data["id"])
    assert code == 0 and "warning: the thread's goal stayed active: the agent works on" in out
