"""Fetching a Codex release from npm into the compat cache (``fixtures.codex_npm``), with
a stand-in ``npm`` on PATH: where the package and the binary land, that a failed or
partial fetch leaves no ``codex`` behind, that a bare binary fetched by hand is replaced
by the package, and the one-line reasons."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from tests.npm_stand_in import stand_in_npm

from fixtures import codex_npm
from fixtures.codex_npm import CodexUnavailable, npm_codex, npm_package

FAKE_NPM = """\
#!{python}
# npm pack --loglevel=error --pack-destination DIR SPEC, as the registry would answer it
import io, sys, tarfile
from pathlib import Path
mode = Path({mode!r}).read_text()
with open({calls!r}, "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\\n")
if mode == "offline":
    sys.stderr.write("npm error code ECONNREFUSED\\nnpm error syscall connect\\n"
                     "npm error FetchError: request to https://registry.npmjs.org/@openai%2fcodex failed\\n"
                     "npm error A complete log of this run can be found in: /x.log\\n")
    sys.exit(1)
destination = Path(sys.argv[sys.argv.index("--pack-destination") + 1])
files = {{"package/README.md": b"codex"}}
if mode == "ok":
    files.update({{{folder!r} + "codex-package.json": b"{{}}", {folder!r} + "bin/codex": b"#!/bin/sh\\necho codex-cli 0.0.1\\n",
                  {folder!r} + "codex-path/rg": b""}})
with tarfile.open(destination / "openai-codex-0.0.1-linux.tgz", "w:gz") as archive:
    for name, data in files.items():
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o755
        archive.addfile(info, io.BytesIO(data))
"""


@pytest.fixture
def npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A stand-in npm on PATH and an empty compat cache; write "ok", "offline" or
    "no-binary" to ``mode`` to choose how it answers."""
    return stand_in_npm(tmp_path, monkeypatch, lambda places: FAKE_NPM.format(
        python=sys.executable, mode=str(places["mode"]), calls=str(places["calls"]), folder=npm_package("0.0.1")[1]))


pytestmark = pytest.mark.skipif(platform.machine() not in codex_npm.TARGETS, reason="no npm build of Codex here")


def test_the_package_lands_in_the_cache_once_and_codex_links_to_its_binary(npm):
    binary = npm_codex("0.0.1")
    release = npm["cache"] / "npm" / "0.0.1"
    assert binary == release / "codex" and binary.resolve() == release / "package" / "bin" / "codex"
    assert binary.read_text().endswith("codex-cli 0.0.1\n") and binary.stat().st_mode & 0o111
    assert (release / "package" / "codex-path" / "rg").is_file()  # the rest of the package is beside it
    assert npm_codex("0.0.1") == binary
    calls = npm["calls"].read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith(f" {npm_package('0.0.1')[0]}")  # the second call used the cache
    assert sorted(path.name for path in (npm["cache"] / "npm").iterdir()) == ["0.0.1"]  # no scratch folder left


@pytest.mark.parametrize(("mode", "says"), [
    ("offline", "npm pack @openai/codex@0.0.1-linux-"),
    ("no-binary", "has no Codex package in package/vendor/"),
])
def test_a_failed_fetch_says_why_in_one_line_and_leaves_no_binary(npm, mode, says):
    npm["mode"].write_text(mode)
    with pytest.raises(CodexUnavailable) as failed:
        npm_codex("0.0.1")
    assert says in str(failed.value) and "\n" not in str(failed.value)
    if mode == "offline":
        assert str(failed.value).endswith("FetchError: request to https://registry.npmjs.org/@openai%2fcodex failed")
    assert list((npm["cache"] / "npm").iterdir()) == []


def test_a_bare_binary_fetched_by_hand_is_replaced_by_the_package(npm):
    bare = npm["cache"] / "npm" / "0.0.1" / "codex"
    bare.parent.mkdir(parents=True)
    bare.write_text("#!/bin/sh\n")
    assert npm_codex("0.0.1") == bare and bare.is_symlink() and (bare.parent / "package" / "codex-package.json").exists()
    assert sorted(path.name for path in (npm["cache"] / "npm").iterdir()) == ["0.0.1"]


def test_without_npm_it_says_so(npm, monkeypatch):
    monkeypatch.setenv("PATH", str(npm["cache"]))
    with pytest.raises(CodexUnavailable, match=r"^npm is not installed, so Codex 0.0.1 cannot be fetched; "
                                               r"set TILLERMAN_CODEX_BIN$"):
        npm_codex("0.0.1")


def test_each_machine_gets_its_own_build():
    assert npm_package("0.171.0", "x86_64") == (
        "@openai/codex@0.171.0-linux-x64", "package/vendor/x86_64-unknown-linux-musl/")
    assert npm_package("0.171.0", "aarch64") == (
        "@openai/codex@0.171.0-linux-arm64", "package/vendor/aarch64-unknown-linux-musl/")
    with pytest.raises(CodexUnavailable, match="no npm build of Codex for"):
        npm_package("0.171.0", "riscv64")


def test_the_command_prints_the_path_or_one_line(npm, capsys):
    assert codex_npm.main(["0.0.1"]) == 0
    assert capsys.readouterr().out == f"{npm['cache'] / 'npm' / '0.0.1' / 'codex'}\n"
    npm["mode"].write_text("offline")
    assert codex_npm.main(["0.0.2"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert codex_npm.main([]) == 2

