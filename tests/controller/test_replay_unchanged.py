"""Replay's pipeline (batches, timers in a heap, snapshots only where a decision needs
one) must record what the event-at-a-time replay recorded, byte for byte.

``replay_digests.json`` holds, for every input below under every rule set below, the
``decisions_digest`` the replay printed and a digest of every row it appended (the
envelopes in order: reports, intents, decisions, transitions, observations, with
their virtual times; left out: the wall-clock ``observed_at`` of replay's own rows,
and where the input files are — their paths, devices and inodes), as the event-at-a-time replay produced them. Inputs: every
recorded session under ``fixtures/sessions`` on its own, the whole folder in one run
(each file on its own clock, so time goes back between files), the disagreement
fixtures, generated rollouts (one long file; a folder of three), a file named twice in
one run, the recorded sessions replayed again into the ledger of a first replay
(their rows are all duplicates there), and a ledger followed by the session it holds. Rule sets: the
built-in ones, the fixtures' grants, the disagreement candidate, and an eager set whose
short thresholds fire timers between most events (one rule shadow, one past its
``expires`` for some inputs). Regenerate only for a change that means to alter
decisions: ``python -m tests.controller.test_replay_unchanged > tests/controller/replay_digests.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from unittest import mock

import msgspec
import pytest

from fixtures.rule_texts import grant, rule
from tillerman.controller.core.intent_requests import SOURCE
from tillerman.controller.replay import replayer as replay
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.load import LedgerLoad
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules import owner
from tillerman.rules.config import load_effective

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "fixtures" / "sessions"
DISAGREEMENT = ROOT / "fixtures" / "disagreement"
GOLDEN = Path(__file__).with_name("replay_digests.json")
AGAIN = "replayed again into the ledger of a first replay: "
#: Who the golden digests were recorded as: the built-in owner grant (``owner:<login>``)
#: is part of every rule set's digest, so each case replays as that owner, whoever runs
#: the tests.
RECORDED_OWNER = "root"


@contextlib.contextmanager
def as_recorded_owner() -> Iterator[None]:
    with mock.patch.object(owner, "local_login", lambda: RECORDED_OWNER):
        yield


@pytest.fixture(autouse=True)
def _recorded_owner() -> Iterator[None]:
    with as_recorded_owner():
        yield

EAGER_RULES = "\n".join((
    rule("quiet-steer", condition={"kind": "turn_quiet", "for": "3s"}, action="steer",
         text="Turn {turn_id} quiet for {quiet_for}.", ack_deadline="30s"),
    rule("quiet-shadow", status="shadow", condition={"kind": "turn_quiet", "for": "2s"}, action="interrupt",
         text="Stop turn {turn_id}."),
    rule("long-turn", condition={"kind": "turn_long", "for": "30s"}, action="report_overdue",
         text="Turn {turn_id} running for {running_for}."),
    rule("approval", condition={"kind": "approval_waiting", "for": "5s"}, action="report_overdue",
         text="Approval waiting {waiting_for}."),
    rule("critical", condition={"kind": "critical_tool_running", "for": "30s"}, action="observe",
         text="Critical tool running {running_for}."),
    rule("failures", condition={"kind": "repeated_failure", "count": 2, "within": "turn"}, action="steer",
         text="{tool} failed {count} times.", ack_deadline="1m"),
    rule("expiring", condition={"kind": "turn_quiet", "for": "4s"}, action="queue",
         text="Queued after {quiet_for} quiet.", expires="2026-10-20"),
    rule("overdue-intent", condition={"kind": "intent_overdue"}, action="report_overdue"),
))
EAGER_GRANTS = grant("rule:quiet-steer", ["steer"]) + grant("rule:failures", ["steer"]) + grant(
    "rule:expiring", ["queue"])


def rule_sets(folder: Path) -> dict[str, tuple[Path | None, Path | None]]:
    """Name -> (rules file, config file)."""
    (folder / "eager-rules.toml").write_text(EAGER_RULES)
    (folder / "eager-grants.toml").write_text(EAGER_GRANTS)
    (folder / "empty.toml").write_text("")
    return {
        "built-in": (None, folder / "empty.toml"),
        "replay grants": (None, SESSIONS / "replay" / "grants.toml"),
        "candidate": (DISAGREEMENT / "candidate.toml", DISAGREEMENT / "grants.toml"),
        "eager": (folder / "eager-rules.toml", folder / "eager-grants.toml"),
    }


def inputs(folder: Path) -> dict[str, list[Path]]:
    from bench.sessions import write_rollout

    found = {str(p.relative_to(SESSIONS)): [p] for p in sorted(SESSIONS.rglob("*.jsonl"))}
    found["fixtures/sessions (one run)"] = [SESSIONS]
    found["fixtures/disagreement (one run)"] = [DISAGREEMENT]
    long = folder / "long" / "rollout.jsonl"
    long.parent.mkdir()
    write_rollout(str(long), 4000, seed=3)
    found["generated rollout 4000 lines"] = [long]
    several = folder / "several"
    several.mkdir()
    for seed in (4, 5, 6):
        write_rollout(str(several / f"rollout-{seed}.jsonl"), 1500, seed=seed)
    found["generated rollouts, 3 files (one run)"] = [several]
    stall = SESSIONS / "replay" / "rollout-2026-10-19T22-00-00-0199b000-0000-7000-8000-00000000bb01.jsonl"
    found["the stall fixture named twice (one run)"] = [stall, stall]  # the second copy's rows are duplicates
    found[f"{AGAIN}fixtures/sessions"] = [SESSIONS]
    with SQLiteRecorder(folder / "stall.sqlite3") as ledger, as_recorded_owner():  # the stall fixture, its ids
        Replayer(ledger, load_effective(None, None).ruleset).run([str(stall)])
    found["a ledger of the stall fixture, then the fixture (one run)"] = [folder / "stall.sqlite3", stall]
    return found


def replay_digests(paths: list[Path], rules: Path | None, config: Path | None, *,
                   runs: int = 1, parse_ahead: bool = False, recorder=None) -> dict[str, str]:
    """Digests of ``runs`` replays of ``paths`` into one ledger (the last run's summary),
    in memory unless ``recorder`` is given."""
    effective = load_effective(rules, config)
    recorder = MemoryRecorder() if recorder is None else recorder
    for _ in range(runs):
        summary = Replayer(recorder, effective.ruleset, patterns=effective.patterns,
                           parse_ahead=parse_ahead).run([str(p) for p in paths])
    rows = hashlib.sha256()
    for entry in recorder.read():
        env = entry.envelope
        if env.source == SOURCE:  # what replay decides is observed at the wall clock's time
            env = msgspec.structs.replace(env, observed_at=0.0)
        else:  # an observation's id is a digest of where its file is (``file_event_id``)
            env = msgspec.structs.replace(env, event_id="")
        rows.update(_placeless(msgspec.json.encode(env).decode()).encode() + b"\n")
    shown = msgspec.to_builtins(summary)
    for file in shown["files"]:
        file["path"] = Path(file["path"]).name
    return {"decisions_digest": summary.decisions_digest, "rows": rows.hexdigest(),
            "summary": hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()}


def _placeless(row: str) -> str:
    """A row as it reads wherever the inputs are: a file's identity names its device
    and inode, its source names its path."""
    row = row.replace(str(_folder()), "<scratch>").replace(str(ROOT), "<root>")
    return re.sub(r"\b\d+:\d+:([0-9a-f]{16})", r"<file>:\1", row)


@cache
def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="replay-unchanged-"))


def cases() -> list[tuple[str, str]]:
    folder = _folder()
    return [(i, r) for i in inputs_cached(folder) for r in rule_sets(folder)]


@cache
def inputs_cached(folder: Path) -> dict[str, list[Path]]:
    return inputs(folder)


def digests() -> dict[str, dict[str, str]]:
    folder = _folder()
    sets, found = rule_sets(folder), inputs_cached(folder)
    return {f"{name} | {rules}": replay_digests(found[name], *sets[rules], runs=1 + name.startswith(AGAIN))
            for name, rules in cases()}


@pytest.mark.parametrize(("name", "rules"), cases())
def test_replay_records_what_the_event_at_a_time_replay_recorded(name, rules):
    folder = _folder()
    golden = json.loads(GOLDEN.read_text())[f"{name} | {rules}"]
    runs = 1 + name.startswith(AGAIN)
    assert replay_digests(inputs_cached(folder)[name], *rule_sets(folder)[rules], runs=runs) == golden


@pytest.mark.parametrize(("name", "rules"), cases())
def test_files_read_in_a_child_process_record_the_same(name, rules, monkeypatch):
    """Every file of every case read by ``ForkedFileReader`` (no size is too small)."""
    monkeypatch.setattr(replay, "PARSE_AHEAD_BYTES", 0)
    monkeypatch.setattr(replay, "_may_fork", lambda: True)  # whatever threads other tests left
    folder = _folder()
    golden = json.loads(GOLDEN.read_text())[f"{name} | {rules}"]
    runs = 1 + name.startswith(AGAIN)
    assert replay_digests(inputs_cached(folder)[name], *rule_sets(folder)[rules], runs=runs,
                          parse_ahead=True) == golden


@pytest.mark.parametrize(("name", "rules"), cases())
def test_into_a_sqlite_ledger_its_load_writes_the_rows_its_appends_write(name, rules, monkeypatch, tmp_path):
    """Every case into a new SQLite ledger with a core to spare, twice: through the
    ledger's load (rows prepared here and written by its process, ``tillerman.ledger.load``:
    used where every file is named once and none is a ledger) and through the SQLite
    recorder's own appends. Every stored column of every row is the same, the decisions
    are the golden ones, and the chain verifies."""
    import sqlite3

    from tillerman.ledger import sqlite

    monkeypatch.setattr(replay, "_may_fork", lambda: False)  # parsed here: the load is what differs
    loads = []
    monkeypatch.setattr(sqlite, "LedgerLoad", lambda path: loads.append(path) or LedgerLoad(path))
    folder = _folder()
    paths = inputs_cached(folder)[name]
    golden = json.loads(GOLDEN.read_text())[f"{name} | {rules}"]
    runs = 1 + name.startswith(AGAIN)
    stored = []
    for load_bytes in (0, 1 << 62):
        monkeypatch.setattr(replay, "LOAD_BYTES", load_bytes)
        path = tmp_path / f"ledger-{load_bytes}.sqlite3"
        with SQLiteRecorder(path) as ledger:
            digests = replay_digests(paths, *rule_sets(folder)[rules], runs=runs, parse_ahead=True, recorder=ledger)
            assert digests["decisions_digest"] == golden["decisions_digest"]
            assert ledger.verify().ok
        with contextlib.closing(sqlite3.connect(path)) as db:  # the with of a connection only commits
            stored.append(db.execute("SELECT * FROM events ORDER BY seq").fetchall())
    assert stored[0] == stored[1]
    named_once = len(set(paths)) == len(paths) and not any(p.suffix == ".sqlite3" for p in paths)
    assert len(loads) == (1 if named_once else 0)


def test_the_eager_rule_set_exercises_timers_decisions_and_shadows():
    """The guard is only as good as what it replays: under the eager set the recorded
    sessions make replay report, propose, decide, expire and shadow, at moments
    between events (timers)."""
    folder = _folder()
    effective = load_effective(*rule_sets(folder)["eager"])
    recorder = MemoryRecorder()
    summary = Replayer(recorder, effective.ruleset).run([str(SESSIONS)])
    rows = list(recorder.read())
    ours = [e.envelope for e in rows if e.envelope.source == SOURCE]
    assert {"report", "intent_proposed", "decision", "intent_transition"} <= {ev_kind(e) for e in ours}
    assert any(getattr(e.event, "shadow", False) for e in ours)
    observed_at = {e.envelope.at for e in rows if e.envelope.source != SOURCE}
    assert any(e.at not in observed_at for e in ours)  # a timer fired between two events
    assert summary.decisions > 10 and summary.reports > 10


def ev_kind(env) -> str:
    return env.event.__struct_config__.tag


if __name__ == "__main__":
    with as_recorded_owner():
        json.dump(digests(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
