"""``tillerman replay`` end to end: counts, determinism, the virtual clock, isolation."""

import json
import os
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.rule_texts import rule
from tests.monitor.test_quarantine import GOOD as QUARANTINE_GOOD
from tillerman.controller.cli.main import main
from tillerman.controller.core.timefmt import parse_time
from tillerman.ledger.sqlite import SQLiteRecorder

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
EXPECTED = tomllib.loads((SESSIONS / "expected.toml").read_text())
STALL = SESSIONS / "replay"
COUNTED = ("format", "records", "events", "quarantined", "threads", "turns", "interrupted_turns", "unclosed_turns")


def replay(*args):
    result = CliRunner().invoke(main, ["replay", *map(str, args)])
    return result.exit_code, result.output


def replay_json(*args):
    code, out = replay("--json", *args)
    assert code == 0, out
    return json.loads(out)


def test_every_recorded_session_replays_with_the_expected_counts():
    summary = replay_json(SESSIONS)
    files = {str(Path(f["path"]).relative_to(SESSIONS)): f for f in summary["files"]}
    assert set(files) == set(EXPECTED)
    for name, expected in EXPECTED.items():
        assert {k: files[name][k] for k in COUNTED} == {k: expected[k] for k in COUNTED}, name


def test_replaying_twice_gives_the_same_digest():
    first, second = replay_json(SESSIONS), replay_json(SESSIONS)
    assert first["decisions_digest"] == second["decisions_digest"]
    assert first == second


def test_rules_fire_on_the_virtual_clock(tmp_path: Path):
    """Three identical failures propose a steer; fifteen quiet minutes report a stall at
    exactly ten, between two events, with no sleeping."""
    ledger = tmp_path / "out.sqlite3"  # never beside the fixtures: the checkout may be read-only
    summary = replay_json("--ledger", ledger, "--config", STALL / "grants.toml", STALL / "rollout-2026-10-19T22-00-00-0199b000-0000-7000-8000-00000000bb01.jsonl")
    with SQLiteRecorder(ledger) as rec:
        entries = list(rec.read())
        assert rec.verify().ok
    assert summary["reports"] == 1 and summary["decisions"] >= 1
    report = next(e.envelope for e in entries if e.envelope.event.__struct_config__.tag == "report")
    assert report.event.rule_id == "stall"
    assert report.at == pytest.approx(parse_time("2026-10-19T22:02:10.900Z") + 600)
    intents = [e.envelope.event.intent for e in entries if e.envelope.event.__struct_config__.tag == "intent_proposed"]
    (intent,) = intents
    assert intent.replayed and intent.mode == "steer" and intent.producer == "rule:repeated-failure"
    assert intent.expected_turn_id == "0199b000-0000-7000-8000-0000000000t1"
    decisions = [e.envelope.event for e in entries if e.envelope.event.__struct_config__.tag == "decision"]
    assert decisions[0].action == "observe" and decisions[0].reason == "replayed_would_steer"
    assert summary["intents"] == {"expired": 1}  # the turn ended before anything could deliver it


def test_without_a_grant_the_rule_is_refused():
    summary = replay_json(STALL)
    assert summary["intents"] == {"rejected": 1}


def test_replay_never_touches_the_configured_ledger(tmp_path, monkeypatch):
    configured = tmp_path / "configured.sqlite3"
    monkeypatch.setenv("TILLERMAN_LEDGER", str(configured))
    replay_json(STALL)
    assert not configured.exists()


def test_a_ledger_replays_like_its_sessions(tmp_path):
    ledger = tmp_path / "l.sqlite3"
    original = replay_json("--ledger", ledger, STALL)
    exported = tmp_path / "export.jsonl"
    result = CliRunner().invoke(main, ["ledger", "export", "--ledger", str(ledger)])
    exported.write_text(result.output)
    for path in (ledger, exported):
        again = replay_json("--format", "ledger", path)
        assert again["decisions_digest"] == original["decisions_digest"]
        assert again["files"][0]["turns"] == 1 and again["files"][0]["events"] == 11


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/nonexistent/session.jsonl"], "no such file or directory"),
        (["--format", "yaml", "x"], "Invalid value for '--format'"),
        (["--rules", "/nonexistent.toml", "x"], "does not exist"),
    ],
)
def test_bad_invocations_exit_2(args, message):
    code, out = replay(*args)
    assert code == 2 and message in out


def test_an_empty_directory_says_what_it_looked_for(tmp_path):
    code, out = replay(tmp_path)
    assert code == 2 and "no session files" in out


def test_an_empty_file_counts_nothing(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (file,) = replay_json(tmp_path)["files"]
    assert file["format"] == "empty" and file["records"] == 0 and file["turns"] == 0


def test_a_file_of_unknown_format_asks_for_format(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"hello": "world"}\n')
    code, out = replay(odd)
    assert code == 2 and "give --format" in out


def test_an_unreadable_file_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    locked = tmp_path / "locked.jsonl"
    locked.write_text("{}\n")
    locked.chmod(0)
    code, out = replay(locked)
    assert code == 2 and "cannot read" in out


def test_invalid_rules_file_is_a_line_accurate_error(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(rule("x", owner="me", review_by="2027-01-01", condition={"kind": "turn_slow", "for": "5m"},
                          action="report_overdue"))
    code, out = replay("--rules", rules, STALL)
    assert code == 2 and "rules.toml:7" in out


def test_human_output_lists_files_and_totals():
    code, out = replay(STALL)
    assert code == 0
    assert "codex-rollout" in out and "decisions" in out and "intents: rejected 1" in out


DEEP = b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n"  # 100k levels


@pytest.mark.parametrize("fmt", sorted(QUARANTINE_GOOD))
def test_deeply_nested_json_is_quarantined_in_every_format(tmp_path, fmt):
    good = QUARANTINE_GOOD[fmt] + b"\n"
    first, later = tmp_path / "first.jsonl", tmp_path / "later.jsonl"
    first.write_bytes(DEEP + good)
    later.write_bytes(good + DEEP + good)
    for path, fmt_option in ((first, fmt), (later, fmt), (later, "auto")):
        (file,) = replay_json("--format", fmt_option, path)["files"]
        assert (file["format"], file["records"], file["quarantined"]) == (fmt, 3 if path == later else 2, 1)
    # told apart by its name alone, a file that opens with one is still replayed
    named = tmp_path / "rollout-2026-11-30T00-00-00-0199a1b2-0000-7000-8000-00000000aa01.jsonl"
    named.write_bytes(DEEP + QUARANTINE_GOOD["codex-rollout"] + b"\n")
    (file,) = replay_json(named)["files"]
    assert (file["format"], file["quarantined"]) == ("codex-rollout", 1)
