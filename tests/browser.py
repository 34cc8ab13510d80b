"""Debian's chromium, headless, for the tests of the timeline page and the dashboard.

``chromium()`` finds ``/usr/bin/chromium``, installing the Debian package with apt-get
when it is absent (a browser download at run time is not reachable here), and skips the
test with the reason when that fails. Every run gets a fresh profile and no network.

``Browser`` is one chromium kept open across the steps of a test and driven over the
DevTools protocol (navigate, wait, click, fill, screenshot), recording what the page
reports on its console: errors, uncaught exceptions and Content-Security-Policy
violations. ``chromium_dom`` and ``chromium_screenshot`` are one-shot command-line runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
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
    """The value of ``expression`` evaluated in the loaded page (a click, then what the
    page shows), once an element matching the CSS selector ``wait_for`` exists: the page
    draws after its load event, later still on a loaded machine."""
    with Browser(timeout=timeout) as browser:
        browser.navigate(page.resolve().as_uri())
        browser.wait_for_selector(wait_for)
        return browser.evaluate(expression)


class BrowserError(AssertionError):
    """The page or chromium did not do what the step waited for."""


class Browser:
    """One headless chromium with one tab, driven over the DevTools protocol.

    Every call waits for its answer; the protocol's events that arrive meanwhile are
    kept (``console_errors``, ``csp_violations``), so nothing runs behind the test's
    back. ``timeout`` bounds each step, not the whole test."""

    def __init__(self, timeout: float = 60.0, size: tuple[int, int] = (1400, 900)):
        self.timeout = timeout
        self.size = size
        self.console_errors: list[str] = []
        self.csp_violations: list[str] = []
        self.exceptions: list[str] = []  # uncaught, the page's or a step's own (also in console_errors)
        self._events: list[dict] = []
        self._next_id = 0

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        # Chromium's helper processes may still write its profile as the browser exits.
        self._profile = tempfile.TemporaryDirectory(prefix="tillerman-chromium-", ignore_cleanup_errors=True)
        self._connection = contextlib.ExitStack()
        self._process = subprocess.Popen(
            [str(chromium()), *FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-port=0",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._devtools_port()
            deadline = time.monotonic() + self.timeout
            while not (pages := [t for t in self._targets(port) if t["type"] == "page"]):
                self._before(deadline, "chromium never opened its tab")
                time.sleep(0.05)
            self._ws = self._connection.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None))
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": self.size[0], "height": self.size[1], "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._connection.close()
        if self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=30)
        self._profile.cleanup()

    # -- the protocol ---------------------------------------------------------------------

    def _devtools_port(self) -> str:
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            self._before(deadline, "chromium never opened its DevTools port")
            time.sleep(0.05)
        return port_file.read_text().split()[0]

    @staticmethod
    def _targets(port: str) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            return json.load(answer)

    def _before(self, deadline: float, what: str) -> None:
        if time.monotonic() >= deadline:
            raise BrowserError(what)
        if self._process.poll() is not None:
            raise BrowserError(f"{what}: chromium exited with {self._process.returncode}")

    def send(self, method: str, params: dict | None = None, *, timeout: float | None = None) -> dict:
        """One protocol command's result (an error answer raises)."""
        self._next_id += 1
        ask = self._next_id
        self._ws.send(json.dumps({"id": ask, "method": method, "params": params or {}}))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            message = self._receive(deadline, f"no answer to {method} (the page's last events:"
                                              f" {[e['method'] for e in self._events[-8:]]};"
                                              f" its errors: {self.console_errors})")
            if message.get("id") == ask:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]

    def _receive(self, deadline: float, what: str) -> dict:
        try:
            message = json.loads(self._ws.recv(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            raise BrowserError(what) from None
        if "method" in message:
            self._note(message)
        return message

    def _note(self, event: dict) -> None:
        """Keep an event; file what the page reported as an error."""
        self._events.append(event)
        method, params = event["method"], event.get("params", {})
        if method == "Log.entryAdded":
            entry = params["entry"]
            if "Content Security Policy" in entry.get("text", ""):
                self.csp_violations.append(entry["text"])
            elif entry.get("level") == "error":
                self.console_errors.append(" ".join(filter(None, (entry.get("text"), entry.get("url")))))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
            self.console_errors.append(self.exceptions[-1])

    # -- the steps ------------------------------------------------------------------------

    def navigate(self, url: str) -> None:
        """Open ``url`` and return once its load event has fired."""
        self._events.clear()
        answer = self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"navigating to {url}: {answer['errorText']}")
        self._loaded(url)

    def _loaded(self, what: str) -> None:
        """Wait for the load event of the page opened since ``_events`` was cleared."""
        deadline = time.monotonic() + self.timeout
        while not any(e["method"] == "Page.loadEventFired" for e in self._events):
            self._receive(deadline, f"{what} never finished loading")

    def evaluate(self, expression: str, *, timeout: float | None = None):
        """The value of ``expression`` in the page (a promise is awaited). An evaluation
        sent while the page navigates finds its context destroyed: asked again then."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                        "returnByValue": True}, timeout=timeout)
            except BrowserError as error:
                if str(error).startswith("no answer") or "context" not in str(error).lower():
                    raise
                self._before(deadline, f"chromium never evaluated: {error}")
                time.sleep(0.05)
                continue
            if "exceptionDetails" in answer:
                raise BrowserError(f"{expression[:200]} threw: {answer['exceptionDetails']}")
            return answer["result"].get("value")

    def wait_for(self, condition: str, what: str = "") -> object:
        """The first truthy value of the JavaScript expression ``condition`` (a promise's,
        once settled), polled in the page every 50 ms (no reload: what the page shows by
        itself)."""
        # A condition's promise that never settles (its own callback threw) ends the wait at
        # the deadline too: the page answers "timed out", never leaves the protocol unanswered.
        poll = (f"new Promise((resolve, reject) => {{ const until = Date.now() + {self.timeout * 1000:.0f};"
                f" setTimeout(() => reject(new Error('timed out')), {self.timeout * 1000:.0f});"
                f" const poll = async () => {{ let v; try {{ v = await ({condition}); }} catch (e) {{ v = undefined; }}"
                f" if (v) resolve(v); else if (Date.now() > until) reject(new Error('timed out'));"
                f" else setTimeout(poll, 50); }}; poll(); }})")
        try:  # the page gives up first, so its answer says what was waited for
            return self.evaluate(poll, timeout=self.timeout + 10)
        except BrowserError as error:
            raise BrowserError(f"waited in vain for {what or condition}: {error}") from None

    def wait_for_selector(self, selector: str) -> None:
        self.wait_for(f"!!document.querySelector({json.dumps(selector)})", what=f"an element {selector!r}")

    def click(self, selector: str, *, navigates: bool = False) -> None:
        """A real mouse click (pressed and released) at the centre of the first element
        matching ``selector`` (of its first line, when it wraps), once it is in view, has
        kept its place for 50 ms and is what the pointer would hit there (a live page may
        redraw it meanwhile);
        ``navigates``: the click opens another page, waited for until it has loaded."""
        box = self.wait_for(f"""new Promise(resolve => {{
            const e = document.querySelector({json.dumps(selector)});
            if (!e) return resolve(null);
            e.scrollIntoView({{block: 'center'}});
            const first = e.getClientRects()[0];  // a link wrapped over lines: its first line's box
            if (!first) return resolve(null);
            setTimeout(() => {{
                // a live swap may have replaced it meanwhile: no box then, looked for again
                const r = e.isConnected ? e.getClientRects()[0] : undefined;
                if (!r) return resolve(null);
                const x = r.x + r.width / 2, y = r.y + r.height / 2, hit = document.elementFromPoint(x, y);
                const still = r.x === first.x && r.y === first.y && r.width > 0;
                resolve(still && hit && (hit === e || e.contains(hit)) ? {{x, y}} : null);
            }}, 50);
        }})""", what=f"{selector!r} in view, still and not covered")
        self._events.clear()
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box["x"], "y": box["y"],
                                                   "button": "left", "clickCount": 1})
        if navigates:
            self._loaded(f"the page {selector} opens")

    def fill(self, selector: str, text: str) -> None:
        """Type ``text`` into the field matching ``selector`` (cleared first), as
        keyboard input: the page sees the input events a person's typing makes."""
        self.wait_for_selector(selector)
        self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                      f" e.focus(); e.value = ''; }})()")
        self.send("Input.insertText", {"text": text})

    def screenshot(self, png: Path) -> Path:
        """The visible page as a PNG."""
        shot = self.send("Page.captureScreenshot", {"format": "png"})
        png.write_bytes(base64.b64decode(shot["data"]))
        return png
