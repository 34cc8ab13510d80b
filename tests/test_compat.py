"""The supported Codex range is stated once per place that needs it, and the places agree:
the releases the error classification was checked against (the source of truth), the
Makefile's ``make compat`` releases, the release the live tests run by default, and the
docs (Upgrading Codex)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from fixtures.codex_npm import cached_path, codex_under_test
from tillerman.controller.codex.process import CODEX_BIN_ENV
from tillerman.controller.core.rpc_errors import CHECKED_CODEX_VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def _make_variable(name: str) -> str:
    return re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_checked_releases_are_listed_oldest_first():
    assert [_release(v) for v in CHECKED_CODEX_VERSIONS] == sorted({_release(v) for v in CHECKED_CODEX_VERSIONS})


def test_make_compat_runs_the_oldest_and_the_newest_checked_release():
    assert (_make_variable("CODEX_OLDEST"), _make_variable("CODEX_NEWEST")) == (
        CHECKED_CODEX_VERSIONS[0], CHECKED_CODEX_VERSIONS[-1])


def test_the_live_tests_run_the_newest_checked_release_from_npm(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPAT_CACHE", str(tmp_path))
    monkeypatch.delenv(CODEX_BIN_ENV, raising=False)
    newest = cached_path(CHECKED_CODEX_VERSIONS[-1])
    newest.parent.mkdir(parents=True)
    newest.write_text("#!/bin/sh\n")
    assert codex_under_test() == newest


def test_no_python_package_pins_codex():
    """The binary comes from npm, where users get Codex; a pip pin would be a second, older source."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert not [requirement for requirement in dev if "codex" in requirement]


def test_the_docs_state_the_range():
    oldest, newest = CHECKED_CODEX_VERSIONS[0], CHECKED_CODEX_VERSIONS[-1]
    assert f"Codex {oldest} to {newest}" in (ROOT / "docs" / "operations" / "upgrading-codex.md").read_text()
