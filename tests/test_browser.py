"""The DevTools driver of ``tests.browser`` against a page served here: each step does
what a person's browser would (a click is a mouse event, filling a field is typed input)
and what the page reports on its console is kept, a Content-Security-Policy violation
apart from other errors."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.browser import Browser, BrowserError

PAGE = b"""<!doctype html><html><head><title>driver</title>
<script src="/page.js"></script></head><body>
<form id="f"><input id="text" name="text"><button id="go" type="submit">Go</button></form>
<p id="shown"></p><script>window.inlineRan = true;</script>
<p style="width: 6em"><a id="next" href="/next">a link long enough to wrap over two lines</a></p>
<p id="swapped"><button id="swap" type="button">swapped</button></p>
</body></html>"""

SCRIPT = b"""window.addEventListener('DOMContentLoaded', () => {
  document.getElementById('f').addEventListener('submit', (e) => {
    e.preventDefault();
    document.getElementById('shown').textContent = 'sent: ' + document.getElementById('text').value;
    console.error('the page says so');
  });
  setTimeout(() => document.body.insertAdjacentHTML('beforeend', '<p id="late">late</p>'), 300);
  // As a live page's swap does: the button is replaced just after the driver has found it
  // (it scrolls it into view first), before it is clicked; the new one counts the clicks.
  const scroll = Element.prototype.scrollIntoView;
  let swaps = 0;
  Element.prototype.scrollIntoView = function (...how) {
    if (this.id === 'swap' && swaps++ === 0) setTimeout(() => {
      document.getElementById('swapped').innerHTML = '<button id="swap" type="button">swapped</button>';
      document.getElementById('swap').addEventListener('click', () => { window.clicks = (window.clicks || 0) + 1; });
    }, 10);
    return scroll.apply(this, how);
  };
});"""


class _Pages(BaseHTTPRequestHandler):
    def do_GET(self):
        body, kind = (SCRIPT, "text/javascript") if self.path == "/page.js" else (PAGE, "text/html")
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Security-Policy", "script-src 'self'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_a_form_filled_and_clicked_and_what_the_page_reported(site, tmp_path):
    with Browser(timeout=30) as browser:
        browser.navigate(site)
        browser.wait_for_selector("#late")  # drawn by the page's own script after load
        browser.fill("#text", "hello <b>there</b>")
        browser.click("#go")
        assert browser.wait_for("document.getElementById('shown').textContent") == "sent: hello <b>there</b>"
        assert browser.evaluate("typeof window.inlineRan") == "undefined"
        assert any("inline script" in v for v in browser.csp_violations), browser.csp_violations
        browser.wait_for("true")  # one more round trip: the console event has arrived
        assert browser.console_errors == ["the page says so"]
        png = browser.screenshot(tmp_path / "page.png")
        browser.click("#next", navigates=True)  # its first line's centre: the box's centre is between lines
        assert browser.evaluate("location.pathname") == "/next"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_click_on_an_element_the_page_replaces_meanwhile_lands_on_its_successor(site):
    with Browser(timeout=30) as browser:
        browser.navigate(site)
        browser.click("#swap")
        assert browser.wait_for("window.clicks") == 1
        assert browser.exceptions == []


def test_a_condition_that_never_settles_fails_the_step_in_time(site):
    with Browser(timeout=1) as browser:
        browser.navigate(site)
        with pytest.raises(BrowserError, match="waited in vain for a promise left pending.*timed out"):
            browser.wait_for("new Promise(() => {})", what="a promise left pending")


def test_a_condition_never_met_fails_the_step(site):
    with Browser(timeout=1) as browser:
        browser.navigate(site)
        with pytest.raises(BrowserError, match="nothing-here"):
            browser.wait_for_selector("#nothing-here")
