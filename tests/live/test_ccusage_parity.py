"""Parity with ccusage (docs/usage/usage-and-budgets.md, "Parity with ccusage"): the pinned
ccusage release (fixtures/ccusage_npm.py) and `tillerman usage` read the same Claude Code
transcripts and Codex rollouts, and their figures are compared per session and per UTC
day, tokens exactly, through the design's mapping
(docs/design.md "Parity with ccusage: where the numbers differ by design").

Generated sessions (fixtures/usage_sessions.py) also carry the figures a correct count
gives, so ccusage itself is checked against them first: a disagreement there is a change
in ccusage (or in the generator), not in tillerman.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fixtures.ccusage_npm import CcusageUnavailable, ccusage_under_test
from fixtures.usage_sessions import Expected, generate

pytestmark = pytest.mark.ccusage
FIGURES = ("input", "cached_input", "cache_write", "output")
CCUSAGE_SECONDS = 120


@functools.cache
def _ccusage_or_reason() -> Path | str:
    try:
        return ccusage_under_test()
    except CcusageUnavailable as reason:
        return str(reason)


@pytest.fixture(scope="module")
def ccusage() -> Path:
    """The pinned ccusage, fetched from npm the first time; skipped with the reason where
    it cannot be, and failed under CI (which has npm)."""
    found = _ccusage_or_reason()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the ccusage parity tests, but {found}")
        pytest.skip(f"ccusage parity tests skipped: {found}")
    return found


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    root = tmp_path_factory.mktemp("generated")
    return root, generate(root, seed=35, size=400_000)


def run_ccusage(ccusage: Path, agent: str, report: str, home: Path) -> dict:
    """``ccusage AGENT REPORT --json`` offline, days in UTC, costs always computed at the
    standard speed: the figures the parity table compares."""
    if agent == "claude":
        options, env = ["--mode", "calculate"], {"CLAUDE_CONFIG_DIR": str(home)}
    else:
        options, env = ["--speed", "standard"], {"CODEX_HOME": str(home)}
    done = subprocess.run([str(ccusage), agent, report, "--json", "--offline", "--timezone", "UTC", *options],
                          capture_output=True, text=True, timeout=CCUSAGE_SECONDS,
                          env={**os.environ, **env, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def claude_figures(row: dict) -> Counter:
    """A ccusage Claude row in tillerman's terms: its inputTokens are the uncached part."""
    return Counter(input=row["inputTokens"] + row["cacheCreationTokens"] + row["cacheReadTokens"],
                   cached_input=row["cacheReadTokens"], cache_write=row["cacheCreationTokens"],
                   output=row["outputTokens"])


def codex_figures(row: dict) -> Counter:
    """A ccusage Codex row in tillerman's terms: inputTokens = input − cached; it reads no cache writes."""
    return Counter(input=row["inputTokens"] + row["cacheReadTokens"], cached_input=row["cacheReadTokens"],
                   output=row["outputTokens"], reasoning=row["reasoningOutputTokens"])


def _compared(figures: Counter, names: tuple[str, ...] = FIGURES) -> dict[str, int]:
    return {name: figures[name] for name in names}


def test_ccusage_counts_the_generated_claude_sessions_as_generated(ccusage, generated):
    root, expected = generated
    sessions = run_ccusage(ccusage, "claude", "session", root / "claude")["sessions"]
    got = {f"{row['projectPath']}/{row['sessionId']}": _compared(claude_figures(row)) for row in sessions}
    assert got == {key: _compared(figures) for key, figures in expected.claude.items()}
    days = run_ccusage(ccusage, "claude", "daily", root / "claude")["daily"]
    assert {row["date"]: _compared(claude_figures(row)) for row in days} == {
        day: _compared(figures) for day, figures in expected.claude_days.items()}


def test_ccusage_counts_the_generated_codex_sessions_as_generated(ccusage, generated):
    root, expected = generated
    names = ("input", "cached_input", "output", "reasoning")
    sessions = run_ccusage(ccusage, "codex", "session", root / "codex")["sessions"]
    got = {row["sessionId"]: _compared(codex_figures(row), names) for row in sessions}
    assert got == {key: _compared(figures, names) for key, figures in expected.codex.items()}
    days = run_ccusage(ccusage, "codex", "daily", root / "codex")["daily"]
    assert {row["date"]: _compared(codex_figures(row), names) for row in days} == {
        day: _compared(figures, names) for day, figures in expected.codex_days.items()}


def run_tillerman(by: str, *paths: Path) -> dict:
    """``tillerman usage --json`` straight from the files, days in UTC."""
    done = subprocess.run([sys.executable, "-m", "tillerman.controller", "usage", "--json", "--by", by,
                           "--timezone", "UTC", *map(str, paths)],
                          capture_output=True, text=True, timeout=CCUSAGE_SECONDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ccusage_session_of(row: dict, root: Path) -> str:
    """The session ccusage names a tillerman row by: a Claude transcript's
    ``project/session`` (a subagent file's parent session), a Codex rollout's path under
    ``sessions/`` without ``.jsonl``."""
    path = Path(row["files"][0]).relative_to(root)
    if row["source"] == "claude":
        project, session = path.parts[2], path.parts[3]
        return f"{project}/{session.removesuffix('.jsonl')}"
    return str(path.relative_to("codex/sessions").with_suffix(""))


def _tillerman_figures(row: dict, names: tuple[str, ...]) -> dict[str, int]:
    return {name: row[name] for name in names}


@pytest.mark.parametrize(("source", "names"), [
    ("claude", FIGURES), ("codex", ("input", "cached_input", "output", "reasoning"))])
def test_tillerman_counts_and_prices_the_generated_sessions_as_ccusage(ccusage, generated, source, names):
    root, _expected = generated
    folder = root / "claude" / "projects" if source == "claude" else root / "codex" / "sessions"
    home = root / source
    figures = claude_figures if source == "claude" else codex_figures
    theirs = {(f"{row['projectPath']}/{row['sessionId']}" if source == "claude" else row["sessionId"]): row
              for row in run_ccusage(ccusage, source, "session", home)["sessions"]}
    ours: dict[str, Counter] = {}  # a subagent's thread is its own row; ccusage counts it in the parent's session
    for row in run_tillerman("session", folder)["rows"]:
        ours.setdefault(ccusage_session_of(row, root), Counter()).update(
            {**_tillerman_figures(row, names), "cost_usd": row["cost_usd"]})
    assert {key: _compared(row, names) for key, row in ours.items()} == {
        key: _compared(figures(row), names) for key, row in theirs.items()}
    cost = "totalCost" if source == "claude" else "costUSD"
    for key, row in ours.items():  # every generated response is under the tiers, of a priced model
        assert row["cost_usd"] == pytest.approx(theirs[key][cost], abs=1e-9), key
    days = {row["date"]: _compared(figures(row), names) for row in run_ccusage(ccusage, source, "daily", home)["daily"]}
    assert {row["day"]: _tillerman_figures(row, names) for row in run_tillerman("day", folder)["rows"]} == days


# -- the project's fixtures -------------------------------------------------------------

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
#: The Claude Code transcripts and Codex rollouts under fixtures/sessions, each folder a
#: project (Claude) or a folder of sessions (Codex), as the two programs find them.
CLAUDE_FIXTURES = ("claude-live", "claude-transcript", "public/claude-transcript")
CODEX_FIXTURES = ("codex-rollout", "public/codex-rollout", "replay")
#: Sessions whose tokens differ by design, each with its cause (the parity table of
#: docs/usage/usage-and-budgets.md names the lines): the scripted Anthropic server numbers
#: its messages msg_fake0001… anew in each recording and Claude Code writes no requestId
#: for it, so one message id is in several files; tillerman counts a message id without a
#: request id once across all files, ccusage's session report once per session.
FIXTURE_SESSION_DIFFERENCES = {
    "claude-live-inject/transcript": "msg_fake0007 counted in claude-live-hooks",
    "claude-live-later/transcript": "msg_fake0009 counted in claude-transcript/7f3c2a10 (its copy is larger)",
    "claude-live-permission/transcript": "msg_fake0016 and 0017 counted in claude-live-interrupt-tool",
    "claude-live-withdrawn/transcript": "msg_fake0014 and 0015 counted in claude-live-permission",
}
#: Days whose tokens differ by design: ccusage's daily report counts every line of a
#: message without requestId (the claude-live recordings), and counts a Codex fork's
#: copied history once where its session report (and tillerman) counts it in both files.
FIXTURE_DAY_DIFFERENCES = {("claude", "2026-12-01"), ("codex", "2026-05-12")}
#: Models ccusage 20.0.24's built-in price table lacks and tillerman's prices: its cost is 0.
PRICED_ONLY_BY_TILLERMAN = {"claude-opus-5-5"}


def lay_out_fixtures(root: Path) -> None:
    """Copy the fixtures where ccusage looks: ``claude/projects/<folder>/…`` (the folder
    path with ``-`` for ``/``, subagent folders kept) and ``codex/sessions/<folder>/…``."""
    for agent, under, folders in (("claude", "projects", CLAUDE_FIXTURES), ("codex", "sessions", CODEX_FIXTURES)):
        for folder in folders:
            for path in sorted((SESSIONS / folder).rglob("*.jsonl")):
                if agent == "claude" and not _transcript(path):
                    continue
                relative = path.relative_to(SESSIONS / folder)
                if agent == "claude" and len(relative.parts) > 1 and relative.parts[1] != "subagents":
                    project, relative = f"{folder}/{relative.parts[0]}", Path(*relative.parts[1:])
                else:
                    project = folder
                target = root / agent / under / project.replace("/", "-") / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())


def _transcript(path: Path) -> bool:
    """A Claude Code transcript, not a recording's stream-json or hook log beside it."""
    return path.name not in ("stdout.jsonl", "hooks.jsonl")


@pytest.fixture(scope="module")
def fixtures_laid_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fixtures")
    lay_out_fixtures(root)
    return root


def _cost_agrees(ours: float | None, theirs: float, models: set[str]) -> bool:
    if ours is None:  # a model no table prices (the scripted Codex model): null here, 0 there
        return theirs == 0
    if theirs == 0 and ours > 0:
        return models <= PRICED_ONLY_BY_TILLERMAN
    return ours == pytest.approx(theirs, abs=1e-9)


@pytest.mark.parametrize(("source", "names"), [
    ("claude", FIGURES), ("codex", ("input", "cached_input", "output", "reasoning"))])
def test_tillerman_and_ccusage_on_the_project_fixtures_differ_only_by_design(ccusage, fixtures_laid_out, source,
                                                                            names):
    root = fixtures_laid_out
    home = root / source
    folder = home / ("projects" if source == "claude" else "sessions")
    figures = claude_figures if source == "claude" else codex_figures
    cost = "totalCost" if source == "claude" else "costUSD"
    theirs = {(f"{row['projectPath']}/{row['sessionId']}" if source == "claude" else row["sessionId"]): row
              for row in run_ccusage(ccusage, source, "session", home)["sessions"]}
    ours: dict[str, dict] = collections.defaultdict(lambda: {"tokens": Counter(), "cost": 0.0, "models": set()})
    for row in run_tillerman("session", folder)["rows"]:
        session = ours[ccusage_session_of(row, root)]
        session["tokens"].update(_tillerman_figures(row, names))
        session["cost"] = None if None in (session["cost"], row["cost_usd"]) else session["cost"] + row["cost_usd"]
        session["models"].update(row["models"])
    for key, row in theirs.items():
        if not any(figures(row).values()):
            continue  # a session of no tokens (only synthetic entries): no row of ours
        # (a session all of whose messages another file counted has no row of ours either)
        same = _compared(ours[key]["tokens"], names) == _compared(figures(row), names)
        assert same != (key in FIXTURE_SESSION_DIFFERENCES), (key, ours[key]["tokens"], figures(row))
        assert _cost_agrees(ours[key]["cost"], row[cost], ours[key]["models"]), (key, ours[key], row[cost])
    assert set(ours) <= set(theirs)
    days = {row["date"]: _compared(figures(row), names) for row in run_ccusage(ccusage, source, "daily", home)["daily"]}
    for row in run_tillerman("day", folder)["rows"]:
        same = _tillerman_figures(row, names) == days[row["day"]]
        assert same != ((source, row["day"]) in FIXTURE_DAY_DIFFERENCES), (row["day"], row, days[row["day"]])
