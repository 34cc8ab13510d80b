"""The dashboard's routes through Starlette's TestClient: who is served, what is refused
(and that a refusal writes nothing), the headers on every response, escaping of agent
text, paging, and actions going through to the ledger."""

from __future__ import annotations

import re
import threading

import anyio
import httpx2 as httpx

import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from tests.hostile import HTML, hostile_session
from tillerman.controller.core import intent_requests
from tillerman.controller.dashboard import app as app_module
from tillerman.controller.dashboard.app import PAGE_SIZE, PROJECT_CHOICES, make_app
from tillerman.controller.dashboard.thread_view import LIMIT
from tillerman.controller.dashboard.guard import CSP, CSRF_HEADER, cookie_name, csrf_token, root, session
from tillerman.controller.report.fold import Facts
from tillerman.ledger import events as ev
from tillerman.ledger.backends import open_recorder
from tillerman.ledger.events import Envelope
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.usage import Tokens

SECRET = "the-secret"
PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
ROOT = root(SECRET)  # every path of the page is under it: the client's relative paths are too
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


def steer_intent() -> Intent:
    return Intent(id="in-steer-1", thread_id="thread-000", mode="queue", text="run the tests",
                  text_digest=text_digest("run the tests"), created_at=NOW + 9, ack_deadline=NOW + 600,
                  expires_at=NOW + 3600)


@pytest.fixture
def ledger(tmp_path):
    recorder = open_recorder(tmp_path / "ledger.sqlite3")
    yield recorder
    recorder.close()


def client_for(recorder, *, signed_in: bool = True) -> TestClient:
    app = make_app(recorder, secret=SECRET, host="127.0.0.1", port=PORT, owner="ann", clock=lambda: NOW + 60)
    client = TestClient(app, base_url=BASE + ROOT, follow_redirects=False)
    if signed_in:
        client.cookies.set(cookie_name(PORT), session(SECRET))
    return client


def test_no_secret_refused_and_token_login_sets_a_strict_cookie(ledger):
    client = client_for(ledger, signed_in=False)
    refused = client.get("/")
    assert refused.status_code == 403 and "not signed in" in refused.text
    assert client.get("/?token=wrong").status_code == 403
    login = client.get(f"/?token={SECRET}")
    assert login.status_code == 303 and login.headers["location"] == f"{ROOT}/"
    cookie = login.headers["set-cookie"]
    # a value derived from the secret, never the secret itself, sent back only under the root:
    # a server on another port of this host is never sent it
    assert cookie.startswith(f"{cookie_name(PORT)}={session(SECRET)};") and SECRET not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert f"Path={ROOT};" in cookie + ";" and len(ROOT) >= len("/d/") + 16  # at least 96 bits
    assert client.get("/").status_code == 200  # the cookie, kept by the client, is enough now


@pytest.mark.parametrize("path", ["/", "/?token=" + SECRET, "/fleet", "/events", "/static/dashboard.css",
                                  "/d/", "/d/x/", ROOT + "x/", "//evil.example/?token=" + SECRET])
def test_outside_the_root_a_plain_404_that_names_nothing(ledger, path):
    client = TestClient(make_app(ledger, secret=SECRET, host="127.0.0.1", port=PORT, owner="ann"),
                        base_url=BASE, follow_redirects=False)
    client.cookies.set(cookie_name(PORT), session(SECRET))
    response = client.get(path)
    assert response.status_code == 404 and response.text == "Not Found\n" and "set-cookie" not in response.headers


def test_security_headers_on_a_refused_event_stream(ledger):
    response = client_for(ledger, signed_in=False).get("/events")
    assert response.status_code == 403 and response.headers["content-security-policy"] == CSP


def test_the_login_redirect_keeps_the_path_as_sent(ledger):
    login = client_for(ledger, signed_in=False).get(f"/thread/a%3Fb?page=2&token={SECRET}")
    assert login.status_code == 303 and login.headers["location"] == f"{ROOT}/thread/a%3Fb?page=2"


@pytest.mark.parametrize("length", [None, 64 * 1024 + 1])
def test_a_body_past_the_limit_is_refused_without_reading_it_all(ledger, length):
    """Straight through ASGI: the test client would read the whole body before sending."""
    app = make_app(ledger, secret=SECRET, host="127.0.0.1", port=PORT, owner="ann")
    headers = {**POST_HEADERS, "host": f"127.0.0.1:{PORT}", "content-type": "application/x-www-form-urlencoded",
               "cookie": f"{cookie_name(PORT)}={session(SECRET)}",
               **({"content-length": str(length)} if length else {})}
    scope = {"type": "http", "method": "POST", "path": f"{ROOT}/action/label", "raw_path": f"{ROOT}/action/label".encode(),
             "root_path": "", "query_string": b"", "scheme": "http", "server": ("127.0.0.1", PORT),
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()], "asgi": {"version": "3.0"},
             "http_version": "1.1", "client": ("127.0.0.1", 1)}
    read, sent = [], []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": b"x" * 1024, "more_body": len(read) < 1000}

    async def send(message):
        sent.append(message)
    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 400 and len(read) <= 66 and ledger.max_seq() == 0


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
    assert re.search(rf'hx-get="{ROOT}/intent/[^"]+"', response.text)  # and then followed live
    assert ledger.max_seq() > before
    refused = client_for(ledger).post("/action/steer", headers=POST_HEADERS, data={"thread": "thread-000"})
    assert refused.status_code == 409 and "Refused:" in refused.text and "text" in refused.text


def test_a_notice_resolved_from_the_page_is_no_longer_shown_overdue(ledger):
    """The page reads overdue as `tillerman overdue` does: a notice a person resolved is not
    counted on the fleet, and its intent loses its overdue mark and its Resolve button (they
    once stayed, and a second click was refused as resolved already)."""
    ledger.append(threads(1))
    late = intent_requests.propose(ledger, now=NOW - 1000, thread_id="thread-000", mode="queue", text="later",
                                   ack_deadline=10.0, owner="ann")
    client = client_for(ledger)
    assert "1 overdue" in client.get("/").text
    assert "Resolve the notice" in client.get(f"/intent/{late.id}").text
    done = client.post("/action/resolve", headers=POST_HEADERS, data={"subject": f"overdue:{late.id}"})
    assert done.status_code == 200, done.text
    assert "Resolve the notice" not in done.text
    assert "overdue" not in client.get("/").text.split('id="fleet"', 1)[1]
    assert "Resolve the notice" not in client.get(f"/intent/{late.id}").text
    assert "Resolve the notice" not in client.get("/thread/thread-000").text


def test_wrong_host_refused_on_get(ledger):
    assert client_for(ledger).get("/", headers={"host": "attacker.example"}).status_code == 403


def reviewed_and_waiting(thread: str, s: str, at: float) -> list[Envelope]:
    """What the hostile session lacks for a thread's page: a reviewer's call and answer, an
    approval still waiting, a label of the thread's stall finding and a command still
    running (kept, as with --retain-payloads), each carrying ``s``."""
    def env(key: str, event: ev.Event, offset: float) -> Envelope:
        return Envelope(event_id=f"{thread}:{key}", event=event, source="appserver", at=at + offset)

    return [env("asked", ev.ReviewPending(thread_id=thread, checkpoint_id=f"k-{s}", checkpoint=f"cp-{s}",
                                          reviewer=f"rev-{s}"), 10),
            env("answered", ev.ReviewCommitted(thread_id=thread, checkpoint_id=f"k-{s}", checkpoint=f"cp-{s}",
                                               reviewer=f"rev-{s}", outcome=f"out-{s}", disposition=f"disp-{s}",
                                               recommended_action=f"do-{s}"), 11),
            env("waiting", ev.ApprovalRequested(thread_id=thread, item_id=f"wait-{s}"), 12),
            env("label", ev.OwnerLabeled(thread_id=thread, subject=f"review:k-{s}", verdict="harmful", by="ann",
                                         note=s), 13),
            env("command", ev.ItemStarted(thread_id=thread, item_id=f"run-{s}", item_type="commandExecution",
                                          tool="exec_command", command=f"run {s}"), 14)]


def test_agent_text_is_escaped_everywhere(ledger):
    hostile = {**HTML, "textarea": "</textarea><b>bold</b>"}
    ledger.append(hostile_session(hostile))
    ledger.append([e for s in hostile.values() for e in reviewed_and_waiting(f"thread-{s}", s, NOW)])
    client = client_for(ledger)
    pages = [client.get("/?size=200")]
    pages += [client.get(f"/thread/{href}") for href in re.findall(rf'href="{ROOT}/thread/([^"]+)"', pages[0].text)]
    assert len(pages) == 1 + len(hostile)
    for page in pages:
        assert page.status_code == 200
        for text in hostile.values():
            if "<" in text:
                assert text not in page.text
        # the only scripts are our static files; no inline style (the CSP forbids both)
        assert re.findall(r"<script[^>]*>", page.text) == [f'<script src="{ROOT}/static/htmx-2.0.11.min.js">',
                                                            f'<script src="{ROOT}/static/dashboard.js">']
        assert " style=" not in page.text and page.text.count("</textarea>") <= 1
    timelines = [client.get(f"/timeline/{href}") for href in re.findall(rf'href="{ROOT}/thread/([^"]+)"', pages[0].text)]
    for page in timelines:  # the report's timeline, its script linked: data only in a JSON block
        assert page.status_code == 200
        assert re.findall(r"<script[^>]*>", page.text) == ['<script type="application/json" id="timeline-data">',
                                                            f'<script src="{ROOT}/timeline-assets/timeline.js">']
        assert "<style" not in page.text and " style=" not in page.text
        assert "<!--<script" not in page.text and "</script><script>window" not in page.text
    shown = "".join(page.text for page in pages)
    for text in hostile.values():  # each was shown, escaped
        assert str(escape(text)) in shown
        # in the thread page's sections: the finding, the tool call, the approval waiting, the reviewer's
        # answer, the command running (in the fleet, on the thread page and in its calls) and the agent's message
        for seen in (f"made no progress for 600s {text}", f"bash {text}", f"wait-{text}", f"rev-{text}",
                     f"out-{text}: disp-{text}".replace("_", " "), f"recommends do-{text}"):
            assert str(escape(seen)) in shown
        assert f'<code class="command">run {escape(text)}</code>' in shown
        assert f'<p class="text">{escape(text)}</p>' in shown
        assert shown.count(f"<code>run {escape(text)}</code>") == 2  # the fleet's Running column and the thread's
    assert shown.count("labeled harmful") == len(hostile)  # each review's label, beside it


def test_fleet_pages_are_bounded(ledger):
    ledger.append(threads(PAGE_SIZE + 7))
    client = client_for(ledger)
    first = client.get("/")
    assert first.text.count(f'href="{ROOT}/thread/') == PAGE_SIZE and "page 1 of 2" in first.text
    second = client.get("/?page=2")
    assert second.text.count(f'href="{ROOT}/thread/') == 7 and 'rel="prev"' in second.text
    assert client.get("/?page=999").text.count(f'href="{ROOT}/thread/') == 7  # past the end: the last page
    assert client.get("/?size=100000").text.count(f'href="{ROOT}/thread/') == PAGE_SIZE + 7  # capped, still all here
    assert client.get("/?size=5&page=x").text.count(f'href="{ROOT}/thread/') == 5


def test_unknown_thread_is_404(ledger):
    assert client_for(ledger).get("/thread/nope").status_code == 404


def labeled_thread() -> list[Envelope]:
    """thread-000 with a stall finding, a reviewer's answer, an intent, a response of an
    unpriced model, and the owner's labels of the finding and the answer."""
    def env(key: str, event: ev.Event, at: float) -> Envelope:
        return Envelope(event_id=key, event=event, source="appserver", at=at)

    return [*threads(1),
            env("stall-1", ev.Report(thread_id="thread-000", turn_id="turn-0", rule_id="quiet", rule_version=1,
                                     finding="turn turn-0 made no progress for 600s"), NOW + 2),
            env("asked", ev.ReviewPending(thread_id="thread-000", checkpoint_id="k1", checkpoint="before_dispatch",
                                          reviewer="rev"), NOW + 3),
            env("answered", ev.ReviewCommitted(thread_id="thread-000", checkpoint_id="k1",
                                               checkpoint="before_dispatch", reviewer="rev", outcome="accepted",
                                               disposition="ready_for_existing_gate"), NOW + 4),
            env("used", ev.Usage(thread_id="thread-000", turn_id="turn-0", source_kind="codex_rollout",
                                 model="no-such-model", tokens=Tokens(input=1200, output=34)), NOW + 5),
            env("l1", ev.OwnerLabeled(thread_id="thread-000", subject="finding:stall-1", verdict="not_useful",
                                      by="ann"), NOW + 6),
            env("l2", ev.OwnerLabeled(thread_id="thread-000", subject="review:k1", verdict="useful", by="ann"), NOW + 7),
            env("l3", ev.OwnerLabeled(thread_id="thread-000", subject="review:k1", verdict="harmful", by="ann"),
                NOW + 8)]


def label_forms(text: str) -> dict[str, str]:
    """Each label form's subject -> the verdict shown standing beside it ("" for none)."""
    forms = re.findall(rf'<form hx-post="{ROOT}/action/label".*?</form>', text, re.S)
    out = {}
    for form in forms:
        subject = re.search(r'name="subject" value="([^"]+)"', form)[1]
        standing = re.search(r"labeled ([a-z ]+)</span>", form)
        out[subject] = standing[1] if standing else ""
        assert re.findall(r'name="verdict" value="(\w+)"', form) == ["useful", "not_useful", "harmful"]
    return out


def test_the_thread_page_labels_findings_and_answers_and_shows_the_standing_verdict(ledger):
    ledger.append(labeled_thread())
    client = client_for(ledger)
    ledger.append([Envelope(event_id="steer", event=ev.IntentProposed(intent=steer_intent()), source="cli",
                            at=NOW + 9)])
    page = client.get("/thread/thread-000").text
    assert label_forms(page) == {"finding:stall-1": "not useful", "review:k1": "harmful",
                                 f"intent:{steer_intent().id}": ""}  # the later label of k1 stands
    assert "accepted: ready for existing gate" in page and "made no progress" in page
    assert "1,234 tokens, unknown price in all" in page and "$0.00" not in page  # unknown, never 0
    assert '<li><span class="since"' in page and "proposed" in page  # the intent's journey, step by step
    fragment = client.get("/live/thread/thread-000").text  # what a live update swaps in: the same sections
    assert label_forms(fragment) == label_forms(page)


def test_a_label_from_the_thread_page_is_recorded_and_then_shown(ledger):
    ledger.append(labeled_thread())
    client = client_for(ledger)
    response = client.post("/action/label", headers=POST_HEADERS, data={"subject": "finding:stall-1",
                                                                       "verdict": "useful"})
    assert response.status_code == 200, response.text
    assert label_forms(client.get("/thread/thread-000").text)["finding:stall-1"] == "useful"


def test_a_threads_lists_are_paged(ledger):
    ledger.append(threads(1))
    ledger.append([Envelope(event_id=f"call-{k}", source="appserver", at=NOW + 1 + k,
                            event=ev.ItemStarted(thread_id="thread-000", turn_id="turn-0", item_id=f"c{k}",
                                                 item_type="commandExecution", tool=f"make step{k}"))
                   for k in range(LIMIT + 3)])
    client = client_for(ledger)
    first = client.get("/thread/thread-000").text
    assert first.count("<td><code>make step") == LIMIT and "page 1 of 2" in first and 'href="?page=2"' in first
    second = client.get("/thread/thread-000?page=2").text
    assert second.count("<td><code>make step") == 3 and "<code>make step0</code>" in second  # oldest last
    live = client.get("/thread/thread-000?page=2").text
    assert f'hx-get="{ROOT}/live/thread/thread-000?page=2"' in live  # a live update keeps the page shown


def test_the_fleet_filters_by_project(ledger):
    ledger.append(threads(3))
    page = client_for(ledger).get("/?project=p1").text
    assert re.findall(r'<option value="(p\d)"', page) == ["p0", "p1", "p2"]
    assert 'name="project" value="p1"' in page
    assert re.findall(rf'href="{ROOT}/thread/([^"]+)"', page) == ["thread-001"]


def test_the_project_suggestions_are_bounded_to_the_most_recent(ledger):
    ledger.append(threads(PROJECT_CHOICES + 20))
    page = client_for(ledger).get("/").text
    suggested = re.findall(r'<option value="(p\d+)">', page)
    # the most recently active (the last started), not every project of the fleet
    assert sorted(suggested, key=lambda p: int(p[1:])) == [f"p{i}" for i in range(20, PROJECT_CHOICES + 20)]


def test_fleet_cells_a_dash_without_usage_and_times_in_two_units(ledger):
    ledger.append(threads(1, at=NOW - 460 * 86400 - 7 * 3600 - 125))
    row = client_for(ledger).get("/").text.split('<tr class="state-', 1)[1].split("</tr>", 1)[0]
    assert '<td data-label="Today">—</td>' in row and "tok" not in row
    assert re.search(r'title="[^"]+">460d7h</span>', row)  # the exact time in the title


def test_the_fleet_is_served_while_a_thread_page_folds_the_ledger(ledger, monkeypatch):
    """Reading the ledger runs in a worker thread: a thread page folding the facts (held
    here until the fleet was served) does not stop the event loop serving the fleet."""
    ledger.append(threads(3))
    folding, fleet_served = threading.Event(), threading.Event()

    class HeldFacts(Facts):
        def apply(self, entry):
            folding.set()
            assert fleet_served.wait(10), "the fleet was not served while the facts were folded"
            super().apply(entry)
    monkeypatch.setattr(app_module, "Facts", HeldFacts)
    app = make_app(ledger, secret=SECRET, host="127.0.0.1", port=PORT, owner="ann", clock=lambda: NOW + 60)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE + ROOT,
                                     cookies={cookie_name(PORT): session(SECRET)}) as client:
            async with anyio.create_task_group() as tg:
                pages = []

                async def thread_page():
                    pages.append(await client.get("/thread/thread-000"))
                tg.start_soon(thread_page)
                assert await anyio.to_thread.run_sync(folding.wait, 10)
                with anyio.fail_after(10):
                    fleet = await client.get("/")
                fleet_served.set()
            return fleet, pages[0]

    fleet, page = anyio.run(scenario)
    assert fleet.status_code == 200 and page.status_code == 200
