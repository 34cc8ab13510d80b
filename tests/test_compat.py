"""The supported Codex range is stated once per place that needs it, and the places agree:
the Makefile's ``make compat`` releases, the releases the error classification was
checked against, the pinned dev dependency, and the docs (Upgrading Codex)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tillerman.controller.core.rpc_errors import CHECKED_CODEX_VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def _make_variable(name: str) -> str:
    return re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)


def test_make_compat_runs_exactly_the_checked_releases():
    assert (_make_variable("CODEX_OLDEST"), _make_variable("CODEX_NEWEST")) == CHECKED_CODEX_VERSIONS


def test_the_pinned_release_is_the_newest_checked():
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert f"openai-codex-cli-bin=={CHECKED_CODEX_VERSIONS[-1]}" in dev


def test_the_docs_state_the_range():
    oldest, newest = CHECKED_CODEX_VERSIONS
    assert f"Codex {oldest} to {newest}" in (ROOT / "docs" / "operations" / "upgrading-codex.md").read_text()
