"""Hostile values on the command line: every error is one line, exits 2 and writes
nothing; a row no reader can decode is reported and skipped, never fatal."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests as lib
from tillerman.ledger.events import Envelope, IntentProposed, TurnStarted
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.sqlite import SQLiteRecorder

NINES = "9" * 400


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(path))
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="t", event=TurnStarted(thread_id="T1", turn_id="U1"),
                             source="appserver:x", at=1.0)])
    return path


@pytest.fixture(autouse=True)
def started(monkeypatch):
    """``run`` never starts a daemon here: the options it would have started with."""
    options = []
    monkeypatch.setattr("tillerman.controller.daemon.daemon.run_daemon",
                        lambda recorder, path, ruleset, opts: options.append(opts))
    return options


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def max_seq(path) -> int:
    with SQLiteRecorder(path) as rec:
        return rec.max_seq()


def assert_one_line_exit_2(result) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output


# -- item 1: a value that cannot be stored is refused; a row that cannot be decoded is skipped


@pytest.mark.parametrize("option", ["--ack-deadline", "--expires", "--effect-deadline"])
@pytest.mark.parametrize("value", [NINES + "s", "99999999d", "367d", "0s", "0ms", "1e400s", "infs", "nans", "-5m"])
def test_a_duration_that_cannot_be_stored_exits_2_and_writes_nothing(ledger, option, value):
    before = max_seq(ledger)
    result = run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "hi", option, value)
    assert_one_line_exit_2(result)
    assert max_seq(ledger) == before


@pytest.mark.parametrize(("field", "value"), [
    ("ack_deadline", float("inf")), ("expires", float("nan")), ("effect_deadline", float("inf")),
    ("ack_deadline", 1e12), ("expires", -1.0), ("ack_deadline", 0.0),
])
def test_the_library_refuses_the_same_values_before_writing(ledger, field, value):
    with SQLiteRecorder(ledger) as rec:
        with pytest.raises(lib.IntentError, match="--" + field.replace("_", "-")):
            lib.propose(rec, thread_id="T1", mode="queue", text="hi", owner="ann", **{field: value})
        assert rec.max_seq() == 1


@pytest.mark.parametrize("now", [float("inf"), float("nan"), -1.0, 1e15])
def test_the_library_refuses_a_time_without_a_calendar_date(ledger, now):
    with SQLiteRecorder(ledger) as rec:
        with pytest.raises(lib.IntentError, match="time of the proposal"):
            lib.propose(rec, now=now, thread_id="T1", mode="queue", text="hi", owner="ann")
        assert rec.max_seq() == 1


def _write_undecodable_intent(path) -> str:
    """What an unvalidated propose once committed: an infinite deadline, stored as null."""
    intent = Intent(id="in-broken", thread_id="T1", mode="queue", text="hi", text_digest=text_digest("hi"),
                    created_at=10.0, ack_deadline=float("inf"), expires_at=float("inf"))
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="in-broken:proposed", event=IntentProposed(thread_id="T1", intent=intent),
                             source="tillerman", at=10.0)])
        (payload,) = rec._db.execute("SELECT payload FROM events WHERE seq = 2").fetchone()
    assert b'"ack_deadline":null' in payload
    return intent.id


def test_every_reader_reports_and_skips_a_row_it_cannot_decode(ledger, tmp_path):
    broken = _write_undecodable_intent(ledger)
    good = json.loads(run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "still works",
                          "--owner", "ann", "--json").stdout)["id"]
    warning = "warning: ledger seq 2 cannot be decoded and was skipped (intent_proposed: Expected `float`, got `null`"
    for args in (["intents"], ["intents", "--json"], ["overdue"], ["overdue", "--json"], ["status"],
                 ["status", "--json"]):
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
        assert warning in result.stderr, (args, result.stderr)
    assert good in run("intents", "--json").stdout and broken not in run("intents").stdout
    assert json.loads(run("status", "--json").stdout)["undecodable"]["2"].startswith("intent_proposed:")
    assert run("intent", "show", good).exit_code == 0
    shown = run("intent", "show", broken)
    assert shown.exit_code == 2 and "record at ledger seq 2 cannot be decoded" in shown.output
    assert run("intent", "cancel", good).exit_code == 0
    exported = run("ledger", "export")
    assert exported.exit_code == 0 and '"kind":"undecodable"' in exported.stdout  # the row, kept as evidence
    replayed = run("replay", "--format", "ledger", "--json", ledger)
    assert replayed.exit_code == 0, replayed.output
    export_file = tmp_path / "export.jsonl"
    export_file.write_text(exported.stdout)
    assert run("replay", "--format", "ledger", export_file).exit_code == 0
    assert run("rules", "proposals").exit_code == 0
    verified = run("ledger", "verify")  # chained as written: a note, not damage
    assert verified.exit_code == 0 and "seq 2: payload does not decode with this version" in verified.output


# -- item 2: an error means nothing was written


@pytest.mark.parametrize("args", [
    ["--thread", "", "--mode", "queue"],
    ["--thread", "  ", "--mode", "queue"],
    ["--thread", "T1\nT2", "--mode", "queue"],
    ["--thread", "T1", "--mode", "queue", "--expected-turn", ""],
    ["--thread", "T1", "--mode", "queue", "--owner", " "],
    ["--thread", "T1", "--mode", "queue", "--verify", ""],
    ["--thread", "T1", "--mode", "queue", "--expect", " "],
    ["--thread", "T1", "--mode", "queue", "--ack-deadline", "99999999d"],
    ["--thread", "T1", "--mode", "queue", "--expires", "99999999d"],
    ["--thread", "T1", "--mode", "queue", "--effect-deadline", NINES + "s"],
])
def test_a_refused_proposal_wrote_nothing(ledger, args):
    before = max_seq(ledger)
    assert_one_line_exit_2(run("intent", "propose", "--text", "hi", *args))
    assert max_seq(ledger) == before


def test_a_long_effect_deadline_within_range_is_kept_not_dropped(ledger):
    data = json.loads(run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "hi",
                          "--effect-deadline", "300d", "--json").stdout)
    assert data["effect_deadline"] is not None


# -- item 6: a cancel that lost the race says what won


def _daemon_moves_first(monkeypatch, ledger, to_state, reason):
    """Between the cancel's read of the intent and its write, the daemon moves it."""
    real = lib.transition_envelope
    raced = []

    def envelope_after_the_daemon_moved(intent, *args, **kwargs):
        if not raced:
            raced.append(True)
            with SQLiteRecorder(ledger) as daemon:
                lib.transition(daemon, intent.id, to_state, reason)
        return real(intent, *args, **kwargs)

    monkeypatch.setattr(lib, "transition_envelope", envelope_after_the_daemon_moved)


@pytest.mark.parametrize(("to_state", "reason", "said"), [
    (lib.State.EXPIRED, "expires_at_passed", "it is expired (expires_at_passed) now, so this move was not made"),
    (lib.State.DISPATCH_UNKNOWN, "dispatching", "it is dispatch_unknown (dispatching) now, so this move was not made"),
])
def test_cancel_reports_the_state_the_daemon_reached_first(ledger, monkeypatch, to_state, reason, said):
    with SQLiteRecorder(ledger) as rec:
        intent = lib.propose(rec, thread_id="T1", mode="queue", text="hi", owner="ann")
    _daemon_moves_first(monkeypatch, ledger, to_state, reason)
    result = run("intent", "cancel", intent.id)
    assert result.exit_code == 1, result.output
    assert said in result.output and not result.output.startswith("cancelled")
    with SQLiteRecorder(ledger) as rec:
        assert lib.intent_view(rec, intent.id).state == to_state


# -- item 12: replay says what a path that is not a file is, and never blocks on it


def test_replay_of_a_fifo_says_it_is_a_fifo(tmp_path):
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    result = run("replay", fifo)  # would block forever if it opened the FIFO
    assert_one_line_exit_2(result)
    assert "is a FIFO (named pipe), not a session file" in result.output


def test_replay_of_a_device_says_it_is_a_device():
    result = run("replay", "/dev/null")
    assert_one_line_exit_2(result)
    assert "is a character device" in result.output


# -- item 14: one line, exit 2, nothing created


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--codex", "http://127.0.0.1:1"], "is not an app-server URL; write unix://PATH or ws://HOST:PORT"),
    (["run", "--codex", ""], "is not an app-server URL"),
    (["run", "--codex", "ws://127.0.0.1:99999"], "Port out of range"),
    (["run", "--trace", "/missing/t.jsonl"], "the folder /missing does not exist"),
    (["run", "--client-name", " "], "--client-name is empty"),
    (["run", "--on-overdue", ""], "--on-overdue is empty"),
    (["ledger", "export", "--after", "99999999999999999999999"], "is not a ledger seq"),
    (["ledger", "export", "--after", "-1"], "is not a ledger seq"),
    (["overdue", "--now", ""], "is not an ISO-8601 time"),
    (["overdue", "--now", "9999-12-31T23:59:59Z"], "outside the years 1970 to 9998"),
    (["rules", "show", "--now", ""], "is not an ISO-8601 time"),
    (["rules", "promote", "quiet", "--to", "shadow", "--by", "ann", "--evaluation", "diff",
      "--rollback-trigger", "any", "--rules", "/missing/x.toml"], "the folder /missing does not exist"),
])
def test_bad_options_are_one_line_and_exit_2(ledger, args, message):
    before = max_seq(ledger)
    result = run(*args)
    assert_one_line_exit_2(result)
    assert message in result.output
    assert max_seq(ledger) == before


@pytest.mark.parametrize("url", ["sqlite:///x.db", "file:///tmp/l"])
@pytest.mark.parametrize("command", [["intents"], ["status"], ["overdue"], ["ledger", "verify"],
                                     ["intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "x"],
                                     ["replay", "--ledger"]])
def test_a_ledger_url_other_than_postgresql_is_refused_and_creates_nothing(tmp_path, monkeypatch, url, command):
    monkeypatch.chdir(tmp_path)
    args = [*command, url, "x.jsonl"] if command == ["replay", "--ledger"] else [*command, "--ledger", url]
    if command == ["replay", "--ledger"]:
        (tmp_path / "x.jsonl").write_text("")
    result = run(*args)
    assert_one_line_exit_2(result)
    assert "is not supported; give --ledger the path of a SQLite file or a postgresql:// URL" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == (["x.jsonl"] if command == ["replay", "--ledger"] else [])


def test_a_ledger_url_in_the_environment_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILLERMAN_LEDGER", "sqlite:///x")
    assert "sqlite:// is not supported" in run("intents").output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["intents"], ["overdue"], ["rules", "proposals"]])
def test_a_reading_command_on_a_missing_ledger_says_so_and_creates_nothing(tmp_path, command):
    target = tmp_path / "nowhere" / "ledger.sqlite3"
    result = run(*command, "--ledger", target)
    assert_one_line_exit_2(result)
    assert f"no ledger at {target}" in result.output
    assert not (tmp_path / "nowhere").exists()


def test_a_writing_command_still_creates_its_ledger(tmp_path):
    target = tmp_path / "new" / "ledger.sqlite3"
    result = run("intent", "propose", "--thread", "T1", "--mode", "queue", "--text", "x", "--ledger", target)
    assert result.exit_code == 0, result.output
    assert target.exists()


# -- item 15: a remote WebSocket is refused unless meant


@pytest.mark.parametrize("url", ["ws://10.0.0.5:4500", "ws://example.com:4500", "wss://[2001:db8::1]:443",
                                 "ws://0.0.0.0:4500"])
def test_a_remote_websocket_is_refused_without_allow_remote(ledger, url):
    result = run("run", "--codex", url)
    assert_one_line_exit_2(result)
    assert "no authentication by default" in result.output and "--allow-remote" in result.output


@pytest.mark.parametrize("url", ["ws://127.0.0.1:4500", "ws://localhost:4500", "ws://[::1]:4500",
                                 "ws://127.8.9.1:4500"])
def test_a_loopback_websocket_needs_no_allow_remote(ledger, started, url):
    result = run("run", "--codex", url)
    assert result.exit_code == 0, result.output
    assert started[0].url == url and "warning" not in result.output


def test_allow_remote_attaches_with_a_warning(ledger, started):
    result = run("run", "--codex", "ws://10.0.0.5:4500", "--allow-remote")
    assert result.exit_code == 0, result.output
    assert started[0].url == "ws://10.0.0.5:4500"
    assert "warning: ws://10.0.0.5:4500 is not on this machine" in result.stderr


def test_run_with_a_trace_and_a_ledger_it_cannot_open_creates_no_trace(tmp_path):
    """The trace file is only tried before the daemon starts (so a folder it cannot write is
    one line at once); the daemon creates it, so a ledger refused first leaves no file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    trace = tmp_path / "t.jsonl"
    result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(tmp_path), "--ledger", str(fifo),
                                       "--trace", str(trace)])
    assert result.exit_code == 2 and "is not a regular file" in result.output, result.output
    assert not trace.exists()


def test_run_with_a_trace_path_ending_in_a_slash_is_refused_and_creates_nothing(tmp_path, monkeypatch):
    """``--trace ws://`` (a URL given to the wrong option): the slash names a folder, and
    opening it as a file once left an empty file ``ws:`` behind (found by the CLI fuzz test)."""
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(tmp_path), "--ledger",
                                       str(tmp_path / "l.sqlite3"), "--trace", "ws://"])
    assert result.exit_code == 2 and "names a folder" in result.output, result.output
    assert sorted(os.listdir(tmp_path)) == before
