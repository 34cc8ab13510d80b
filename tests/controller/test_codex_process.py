"""Which ``codex`` ``tillerman run --spawn-codex`` runs: --codex-bin, then
$TILLERMAN_CODEX_BIN, then PATH (where npm installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tillerman.controller.codex.process import CODEX_BIN_ENV, CodexBinaryMissing, find_codex_binary, helper_path_dir


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An explicit binary, one in $TILLERMAN_CODEX_BIN and one on PATH."""
    found = {name: _executable(tmp_path / name / "codex") for name in ("explicit", "env", "path")}
    monkeypatch.setenv(CODEX_BIN_ENV, str(found["env"]))
    monkeypatch.setenv("PATH", str(found["path"].parent))
    return found


def test_codex_bin_comes_first(places):
    assert find_codex_binary(places["explicit"]) == places["explicit"]


def test_then_the_environment_variable(places):
    assert find_codex_binary() == places["env"]


def test_then_codex_on_path(places, monkeypatch):
    monkeypatch.delenv(CODEX_BIN_ENV)
    assert find_codex_binary() == places["path"]


def test_nothing_anywhere_says_how_to_install(places, monkeypatch):
    monkeypatch.delenv(CODEX_BIN_ENV)
    monkeypatch.setenv("PATH", str(places["path"].parent.parent))
    with pytest.raises(CodexBinaryMissing, match=r"^no codex binary on PATH; "
                                                 r"install Codex \(npm install -g @openai/codex\) or pass --codex-bin PATH$"):
        find_codex_binary()


@pytest.mark.parametrize("origin", ["--codex-bin", CODEX_BIN_ENV])
def test_a_named_binary_that_is_missing_or_not_executable_is_an_error_not_skipped(places, monkeypatch, origin):
    missing = places["explicit"].parent / "nope"
    plain = places["explicit"].parent / "plain"
    plain.write_text("")
    for bad in (missing, plain, places["explicit"].parent):
        if origin == CODEX_BIN_ENV:
            monkeypatch.setenv(CODEX_BIN_ENV, str(bad))
        with pytest.raises(CodexBinaryMissing, match=f"^{origin} {bad}: no executable file there"):
            find_codex_binary(bad if origin == "--codex-bin" else None)


def test_the_helper_dir_is_found_beside_the_real_binary(tmp_path):
    """The package layout: <pkg>/bin/codex and <pkg>/codex-path/ (ripgrep); a symlink on
    PATH (as npm and the tests make) leads to it."""
    binary = _executable(tmp_path / "pkg" / "bin" / "codex")
    (tmp_path / "pkg" / "codex-path").mkdir()
    link = tmp_path / "on-path" / "codex"
    link.parent.mkdir()
    link.symlink_to(binary)
    assert helper_path_dir(link) == tmp_path / "pkg" / "codex-path"
    assert helper_path_dir(_executable(tmp_path / "elsewhere" / "codex")) is None
