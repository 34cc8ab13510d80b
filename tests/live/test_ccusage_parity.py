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
