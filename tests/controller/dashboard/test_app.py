"""The dashboard's routes through Starlette's TestClient: who is served, what is refused
(and that a refusal writes nothing), the headers on every response, escaping of agent
text, paging, and actions going through to the ledger."""

from __future__ import annotations

import re

import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from tests.hostile import HTML, hostile_session
from tillerman.controller.dashboard.app import PAGE_SIZE, make_app
from tillerman.controller.dashboard.guard import CSP, CSRF_HEADER, cookie_name, csrf_token
from tillerman.ledger import events as ev
from tillerman.ledger.backends import open_recorder
from tillerman.ledger.events import Envelope

SECRET = "the-secret"
PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
NOW = 1_700_000_000.0
POST_HEADERS = {"origin": BASE, CSRF_HEADER: csrf_token(SECRET)}


def threads(n: int, at: float = NOW) -> list[Envelope]:
    out = []
    for i in range(n):
        t = f"thread-{i:03d}"
        out += [Envelope(event_id=f"{t}:start", event=ev.ThreadStarted(thread_id=t, cwd=f"/work/p{i}"),
                         source="appserver", at=at + i),
                Envelope(event_id=f"{t}:turn", event=ev.TurnStarted(thread_id=t, turn_id=f"turn-{i}"),
                         source="appserver", at=at + i + 0.5)]
    return out


@pytest.fixture
def ledger(tmp_path):
    recorder = open_recorder(tmp_path / "ledger.sqlite3")
    yield recorder
    recorder.close()


def client_for(recorder, *, signed_in: bool = True) -> TestClient:
    app = make_app(recorder, secret=SECRET, host="127.0.0.1", port=PORT, owner="ann", clock=lambda: NOW + 60)
    client = TestClient(app, base_url=BASE, follow_redirects=False)
    if signed_in:
        client.cookies.set(cookie_name(PORT), SECRET)
    return client


def test_no_secret_refused_and_token_login_sets_a_strict_cookie(ledger):
    client = client_for(ledger, signed_in=False)
    refused = client.get("/")
    assert refused.status_code == 403 and "not signed in" in refused.text
    assert client.get("/?token=wrong").status_code == 403
    login = client.get(f"/?token={SECRET}")
    assert login.status_code == 303 and login.headers["location"] == "/"
    cookie = login.headers["set-cookie"]
    assert cookie.startswith(f"{cookie_name(PORT)}={SECRET};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/" in cookie
    assert client.get("/").status_code == 200  # the cookie, kept by the client, is enough now


@pytest.mark.parametrize("path", ["/", "/fleet", "/static/dashboard.css", "/timeline-assets/timeline.js",
                                  "/timeline/nope", "/nowhere", "/?token=wrong"])
def test_security_headers_on_every_response(ledger, path):
    for client in (client_for(ledger), client_for(ledger, signed_in=False)):
        response = client.get(path)
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(("headers", "why"), [
    ({"host": "evil.example:8765", **POST_HEADERS}, "Host"),  # DNS rebinding
    ({"origin": "http://evil.example", CSRF_HEADER: csrf_token(SECRET)}, "cross-origin"),
    ({"origin": BASE}, "CSRF"),
    ({"origin": BASE, CSRF_HEADER: "forged"}, "CSRF"),
    ({CSRF_HEADER: csrf_token(SECRET)}, "Origin"),
])
def test_refused_posts_write_nothing(ledger, headers, why):
    ledger.append(threads(1))
    before = ledger.max_seq()
    response = client_for(ledger).post("/action/steer", headers=headers,
                                       data={"thread": "thread-000", "text": "look at the failing test"})
    assert response.status_code == 403 and why in response.text
    assert ledger.max_seq() == before


def test_an_action_goes_through_to_the_ledger(ledger):
    ledger.append(threads(1))
    before = ledger.max_seq()
    response = client_for(ledger).post("/action/queue", headers=POST_HEADERS,
                                       data={"thread": "thread-000", "text": "then run the tests"})
    assert response.status_code == 200, response.text
    assert "Done:" in response.text and "then run the tests" in response.text  # the intent, shown as proposed
    assert re.search(r'hx-get="/intent/[^"]+"', response.text)  # and then followed live
    assert ledger.max_seq() > before
    refused = client_for(ledger).post("/action/steer", headers=POST_HEADERS, data={"thread": "thread-000"})
    assert refused.status_code == 409 and "Refused:" in refused.text and "text" in refused.text


def test_wrong_host_refused_on_get(ledger):
    assert client_for(ledger).get("/", headers={"host": "attacker.example"}).status_code == 403


def test_agent_text_is_escaped_everywhere(ledger):
    hostile = {**HTML, "textarea": "</textarea><b>bold</b>"}
    ledger.append(hostile_session(hostile))
    client = client_for(ledger)
    pages = [client.get("/?size=200")]
    pages += [client.get(f"/thread/{href}") for href in re.findall(r'href="/thread/([^"]+)"', pages[0].text)]
    assert len(pages) == 1 + len(hostile)
    for page in pages:
        assert page.status_code == 200
        for text in hostile.values():
            if "<" in text:
                assert text not in page.text
        # the only scripts are our static files; no inline style (the CSP forbids both)
        assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/static/htmx-2.0.11.min.js">',
                                                            '<script src="/static/dashboard.js">']
        assert " style=" not in page.text and page.text.count("</textarea>") <= 1
    timelines = [client.get(f"/timeline/{href}") for href in re.findall(r'href="/thread/([^"]+)"', pages[0].text)]
    for page in timelines:  # the report's timeline, its script linked: data only in a JSON block
        assert page.status_code == 200
        assert re.findall(r"<script[^>]*>", page.text) == ['<script type="application/json" id="timeline-data">',
                                                            '<script src="/timeline-assets/timeline.js">']
        assert "<style" not in page.text and " style=" not in page.text
        assert "<!--<script" not in page.text and "</script><script>window" not in page.text
    shown = "".join(page.text for page in pages)
    for text in hostile.values():  # each was shown, escaped
        assert str(escape(text)) in shown


def test_fleet_pages_are_bounded(ledger):
    ledger.append(threads(PAGE_SIZE + 7))
    client = client_for(ledger)
    first = client.get("/")
    assert first.text.count('href="/thread/') == PAGE_SIZE and "page 1 of 2" in first.text
    second = client.get("/?page=2")
    assert second.text.count('href="/thread/') == 7 and 'rel="prev"' in second.text
    assert client.get("/?page=999").text.count('href="/thread/') == 7  # past the end: the last page
    assert client.get("/?size=100000").text.count('href="/thread/') == PAGE_SIZE + 7  # capped, still all here
    assert client.get("/?size=5&page=x").text.count('href="/thread/') == 5


def test_unknown_thread_is_404(ledger):
    assert client_for(ledger).get("/thread/nope").status_code == 404
