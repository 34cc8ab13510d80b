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
    # Chromium's helper processes may still write its profile as the browser exits.
    with tempfile.TemporaryDirectory(prefix="tillerman-chromium-", ignore_cleanup_errors=True) as profile:
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


def chromium_evaluate(page: Path, expression: str, wait_for: str, timeout: float = 60.0):
    """The value of ``expression`` evaluated in the loaded page, over the DevTools
    protocol (a click, then what the page shows), once an element matching the CSS
    selector ``wait_for`` exists: the page draws after its load event, later still on a
    loaded machine."""
    import json
    import time
    import urllib.request

    from websockets.sync.client import connect

    # Chromium's helper processes may still write its profile as the browser exits.
    with tempfile.TemporaryDirectory(prefix="tillerman-chromium-", ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen(
            [str(chromium()), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--window-size=1400,900", page.resolve().as_uri()],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout
            while not (port_file.exists() and port_file.read_text().strip()):
                assert time.monotonic() < deadline, "chromium never opened its DevTools port"
                time.sleep(0.05)
            port = port_file.read_text().split()[0]
            while True:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                    pages = [t for t in json.load(answer) if t["type"] == "page" and t["url"].startswith("file:")]
                if pages:
                    break
                assert time.monotonic() < deadline, "chromium never opened the page"
                time.sleep(0.05)
            with connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
                # An evaluation sent while the page is still navigating finds its context
                # destroyed and answers with an error: ask again in the new context.
                for attempt in range(1, 1000):
                    ws.send(json.dumps({"id": attempt, "method": "Runtime.evaluate", "params": {
                        "expression": f"new Promise(r => {{ const poll = () => document.querySelector("
                                      f"{json.dumps(wait_for)}) ? r() : setTimeout(poll, 50); poll(); }})"
                                      f".then(() => ({expression}))",
                        "awaitPromise": True, "returnByValue": True}}))
                    while (reply := json.loads(ws.recv(timeout=timeout))).get("id") != attempt:
                        pass
                    if "result" in reply:
                        break
                    assert time.monotonic() < deadline, f"chromium never evaluated: {reply}"
                    time.sleep(0.05)
            result = reply["result"]
            assert "exceptionDetails" not in result, result
            return result["result"].get("value")
        finally:
            browser.terminate()
            browser.wait(timeout=30)
