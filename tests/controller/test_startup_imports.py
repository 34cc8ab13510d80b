"""Every ``tillerman`` command pays for what it imports before it does anything: a
command imports only what it runs (``tillerman.controller.cli.main``). A replay needs none
of the daemon's WebSocket client, pydantic (rule and config files are validated with
it, the built-in rules come compiled), the metrics library or PostgreSQL's driver."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tillerman.monitor.formats import PARSERS

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = ROOT / "fixtures" / "sessions" / "codex-rollout"
HEAVY = ("websockets", "pydantic", "prometheus_client", "psycopg", "anyio", "sqlite3", "multiprocessing")
# Runs the command in a fresh interpreter, then names the heavy packages it imported.
PROBE = """
import json, sys
from tillerman.controller.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))))
"""


def imported(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}" + PROBE, *args],
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["replay", "--help"],
    ["replay", "--json", str(ROLLOUTS / "rollout-2026-11-30T00-04-14-01a229c4-3717-7c10-9d2e-5b7f0c9e1a01.jsonl")],
    ["--help"],
    ["intents", "--help"],
], ids=["replay --help", "replay FILE", "--help", "intents --help"])
def test_a_command_imports_none_of_what_it_does_not_run(args):
    assert imported(*args) == []


def test_a_replay_into_a_ledger_imports_sqlite_and_still_no_daemon(tmp_path):
    rollout = ROLLOUTS / "rollout-2026-11-30T00-04-14-01a229c4-3717-7c10-9d2e-5b7f0c9e1a01.jsonl"
    assert imported("replay", "--json", "--ledger", str(tmp_path / "l.sqlite3"), str(rollout)) == ["sqlite3"]


def test_each_format_names_its_parser_which_is_imported_when_asked_for():
    assert sorted(PARSERS) == sorted(PARSERS[name].format for name in PARSERS)


def test_help_lists_each_command_once_after_one_was_loaded():
    from click.testing import CliRunner

    from tillerman.controller.cli.main import main

    runner = CliRunner()
    assert runner.invoke(main, ["replay", "--help"]).exit_code == 0
    lines = runner.invoke(main, ["--help"]).output.split("Commands:")[1].splitlines()
    listed = [line.split()[0] for line in lines if line.startswith("  ")]
    assert len(listed) == len(set(listed)) and "replay" in listed
