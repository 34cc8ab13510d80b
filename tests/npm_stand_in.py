"""A stand-in ``npm`` for the tests of the release fetchers (``fixtures/codex_npm.py``,
``fixtures/ccusage_npm.py``): a script on PATH that answers ``npm pack`` as the test's
``mode`` file says, and an empty compat cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def stand_in_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 script: Callable[[dict[str, Path]], str]) -> dict[str, Path]:
    """``script(places)`` writes the npm script from the places it reads ("mode": how to
    answer, "calls": where it logs its arguments); returns them and "cache"."""
    bin_dir, cache = tmp_path / "bin", tmp_path / "compat"
    bin_dir.mkdir()
    places = {"mode": tmp_path / "mode", "calls": tmp_path / "calls", "cache": cache}
    places["mode"].write_text("ok")
    places["calls"].write_text("")
    npm = bin_dir / "npm"
    npm.write_text(script(places))
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("COMPAT_CACHE", str(cache))
    return places
