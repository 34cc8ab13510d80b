"""Fetching the pinned ccusage from npm into the compat cache (``fixtures.ccusage_npm``),
with a stand-in ``npm`` on PATH: the launcher and the native build land beside each
other, ``ccusage`` is the native binary made executable, and a failed fetch or a
launcher naming another native release leaves nothing behind and says why in one line."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from tests.npm_stand_in import stand_in_npm

from fixtures import ccusage_npm
from fixtures.ccusage_npm import CcusageUnavailable, native_package, npm_ccusage

FAKE_NPM = """\
#!{python}
# npm pack --loglevel=error --pack-destination DIR SPEC, as the registry would answer it
import io, json, sys, tarfile
from pathlib import Path
mode = Path({mode!r}).read_text()
spec = sys.argv[-1]
with open({calls!r}, "a") as calls:
    calls.write(spec + "\\n")
if mode == "offline":
    sys.stderr.write("npm error code ECONNREFUSED\\nnpm error FetchError: request to https://registry.npmjs.org/ccusage failed\\n")
    sys.exit(1)
name, version = spec.rsplit("@", 1)
if name == "ccusage":
    named = "9.9.9" if mode == "other-native" else version
    manifest = {{"name": "ccusage", "version": version, "optionalDependencies": {{{native!r}: named}}}}
    files = {{"package/package.json": json.dumps(manifest).encode()}}
else:
    files = {{"package/package.json": b"{{}}", "package/bin/ccusage": b"#!/bin/sh\\necho ccusage " + version.encode() + b"\\n"}}
with tarfile.open(destination := Path(sys.argv[sys.argv.index("--pack-destination") + 1]) / "p.tgz", "w:gz") as archive:
    for member, data in files.items():
        info = tarfile.TarInfo(member)
        info.size, info.mode = len(data), 0o644
        archive.addfile(info, io.BytesIO(data))
"""


@pytest.fixture
def npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A stand-in npm on PATH and an empty compat cache; write "ok", "offline" or
    "other-native" to ``mode`` to choose how it answers."""
    return stand_in_npm(tmp_path, monkeypatch, lambda places: FAKE_NPM.format(
        python=sys.executable, mode=str(places["mode"]), calls=str(places["calls"]), native=native_package()))


pytestmark = pytest.mark.skipif(platform.machine() not in ccusage_npm.SUFFIXES, reason="no npm build of ccusage here")


def test_the_native_binary_lands_in_the_cache_once_executable(npm):
    binary = npm_ccusage("1.2.3")
    release = npm["cache"] / "npm" / "ccusage-1.2.3"
    assert binary == release / "ccusage" and binary.resolve() == release / "native" / "bin" / "ccusage"
    assert binary.stat().st_mode & 0o111 and binary.read_text().endswith("ccusage 1.2.3\n")
    assert npm_ccusage("1.2.3") == binary
    assert npm["calls"].read_text().splitlines() == ["ccusage@1.2.3", f"{native_package()}@1.2.3"]
    assert [path.name for path in (npm["cache"] / "npm").iterdir()] == ["ccusage-1.2.3"]  # no scratch folder left


@pytest.mark.parametrize(("mode", "says"), [
    ("offline", "npm pack ccusage@1.2.3 failed (offline, or no such release?): FetchError: request to"),
    ("other-native", f"ccusage@1.2.3 from npm does not name {native_package()}@1.2.3"),
])
def test_a_failed_fetch_says_why_in_one_line_and_leaves_nothing(npm, mode, says):
    npm["mode"].write_text(mode)
    with pytest.raises(CcusageUnavailable) as failed:
        npm_ccusage("1.2.3")
    assert says in str(failed.value) and "\n" not in str(failed.value)
    assert list((npm["cache"] / "npm").iterdir()) == []


def test_without_npm_or_a_build_it_says_so(npm, monkeypatch):
    monkeypatch.setenv("PATH", str(npm["cache"]))
    with pytest.raises(CcusageUnavailable, match=r"^npm is not installed, so ccusage 1.2.3 cannot be fetched; "
                                                 r"set TILLERMAN_CCUSAGE_BIN$"):
        npm_ccusage("1.2.3")
    with pytest.raises(CcusageUnavailable, match="no npm build of ccusage for"):
        native_package("riscv64")
