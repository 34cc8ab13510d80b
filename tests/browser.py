"""Debian's chromium, headless, for the tests of the timeline page.

``chromium()`` finds ``/usr/bin/chromium``, installing the Debian package with apt-get
when it is absent (a browser download at run time is not reachable here), and skips the
test with the reason when that fails. Every run gets a fresh profile and no network.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@cache
def _install() -> str | None:
    """None when chromium is there (now); else why it could not be installed."""
    if CHROMIUM.exists():
        return None
    if shutil.which("apt-get") is None:
        return "no /usr/bin/chromium and no apt-get to install it"
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                              env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return None if CHROMIUM.exists() else "apt-get installed chromium, but /usr/bin/chromium is missing"


def chromium() -> Path:
    why = _install()
    if why is not None:
        pytest.skip(f"headless chromium is not available: {why}")
    return CHROMIUM


def _run(page: Path, *extra: str, size: str = "1400,900") -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="tillerman-chromium-") as profile:
        return subprocess.run(
            [str(chromium()), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=3000",
             f"--window-size={size}", *extra, page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120)


def chromium_dom(page: Path) -> str:
    """The page's DOM once its script has run (``--dump-dom``)."""
    done = _run(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def chromium_screenshot(page: Path, png: Path, size: str = "1400,900") -> Path:
    done = _run(page, f"--screenshot={png}", size=size)
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return png
