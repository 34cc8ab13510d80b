"""``tillerman dashboard`` in Debian's headless chromium (``tests.browser``) beside a daemon
supervising the REAL Codex app-server with the scripted model: the fleet lists the live
threads by a name a person recognises and takes new ones without a reload; a steer from
the thread page's form is delivered exactly once and the page shows it acknowledged; a
label click records one OwnerLabeled; requests without the secret, with a foreign Origin
or Host, or without the CSRF token are refused and write nothing; a thread whose command
and answer carry script and markup shows them as text and runs nothing.

The dashboard is its own process (``python -m tillerman dashboard --port 0``), as a
person runs it, logged in through the token URL it prints. ``TILLERMAN_UPDATE_DOCS=1``
copies the screenshots to ``docs/dashboard-live.png`` and ``docs/dashboard-thread.png``.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2 as httpx
import pytest

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.browser import Browser
from tests.live.daemon_support import OWNER, OWNER_GRANT, SETTLED, ruleset_from, session, wait_until
from tillerman.ledger import events as ev
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = [pytest.mark.live, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The agent's command (and so its answer, "done: <cmd>") carries markup that would run.
MARKUP = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\">"
SCRIPT = MARKUP[:MARKUP.index("<img")]
STEER = "Write the notes down before the next command."
STEER_FORM = 'form[hx-post$="action/steer"]'
#: Every live fragment queues its refreshes: one request in flight, the triggers meanwhile one after it.
LIVE_SYNCED = ("[...document.querySelectorAll('[data-live]')].length > 0 && [...document.querySelectorAll('[data-live]')]"
               ".every(e => e.getAttribute('hx-sync') === 'this:queue last')")


@contextlib.contextmanager
def dashboard(ledger: Path) -> Iterator[str]:
    """``tillerman dashboard`` on a free port: the login URL it prints (its secret kept
    beside the ledger, not in the user's state directory)."""
    env = dict(os.environ, XDG_STATE_HOME=str(ledger.parent / "state"), XDG_CONFIG_HOME=str(ledger.parent / "config"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    server = subprocess.Popen([sys.executable, "-m", "tillerman", "dashboard", "--ledger", str(ledger),
                               "--port", "0", "--owner", OWNER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    said: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [said.put(line) for line in server.stdout], daemon=True).start()
    try:
        while not (found := re.search(r"(http://\S+\?token=\S+)", said.get(timeout=60))):
            pass
        yield found.group(1)
    finally:
        server.terminate()
        server.wait(timeout=30)


def head_seq(ledger: Path) -> int:
    with SQLiteRecorder(ledger) as recorder:
        return max((entry.seq for entry in recorder.read()), default=0)


def page_csrf(page: str) -> dict[str, str]:
    """The CSRF header the page's script sends with every POST (htmx's ``hx-headers``)."""
    return json.loads(html.unescape(re.search(r"hx-headers='([^']*)'", page).group(1)))


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def refusals(base: str, login: str, form: dict[str, str]) -> dict[str, int]:
    """Each request the guard must refuse, of a label it would otherwise record (``form``;
    ``base``: the page's URL, under which the actions are): the status each got."""
    origin = origin_of(base)
    signed_in = httpx.Client()
    csrf = page_csrf(signed_in.get(login, follow_redirects=True).text)  # the cookie, as the browser holds it
    anonymous = httpx.Client()
    asks = {
        "no secret": lambda: anonymous.post(f"{base}/action/label", data=form,
                                            headers={"origin": origin, **csrf}),
        "no secret (GET)": lambda: anonymous.get(f"{base}/"),
        "foreign Origin": lambda: signed_in.post(f"{base}/action/label", data=form,
                                                 headers={"origin": "http://evil.example", **csrf}),
        "foreign Host": lambda: signed_in.post(f"{base}/action/label", data=form,
                                               headers={"host": "evil.example", "origin": "http://evil.example",
                                                        **csrf}),
        "no CSRF token": lambda: signed_in.post(f"{base}/action/label", data=form, headers={"origin": origin}),
        "wrong CSRF token": lambda: signed_in.post(f"{base}/action/label", data=form,
                                                   headers={"origin": origin, **{k: "x" + v for k, v in csrf.items()}}),
    }
    try:
        return {what: ask().status_code for what, ask in asks.items()}
    finally:
        signed_in.close()
        anonymous.close()


async def test_the_dashboard_in_a_browser_beside_a_live_daemon(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    async with session(app_server, tmp_path) as s:
        # payloads kept: a thread's name is its first prompt, the hostile one's markup included
        await s.start_daemon(ruleset_from(s.tmp_path, "", OWNER_GRANT), retain_payloads=True)
        hostile, hostile_turn = await s.start_command(workspace, f"RUN: echo '{MARKUP}'")
        assert await s.turn_completed(hostile, hostile_turn) == "completed"
        # The daemon subscribes to a thread another client started once it sees it, so on a
        # loaded machine the first turn's prompt may pass before it listens; the same prompt
        # again, now that it does, is the first it records: the thread's name.
        again = await s.start_turn(hostile, f"RUN: echo '{MARKUP}'")
        assert await s.turn_completed(hostile, again) == "completed"
        with dashboard(ledger) as login, Browser(timeout=30) as browser:
            base = login.split("?", 1)[0].rstrip("/")
            browser.navigate(login)
            browser.wait_for_selector(f'a[href$="thread/{hostile}"]')
            browser.evaluate("window.sameDocument = true")  # gone if the page reloads
            assert browser.evaluate(LIVE_SYNCED) is True

            # (a, b) a thread started while the page is open appears on it, by its name
            thread, turn = await s.start_command(workspace, "RUN: sleep 6")
            name = browser.wait_for(f"document.querySelector('a[href$=\"thread/{thread}\"]')?.textContent.trim()",
                                    what="the new thread's row")
            assert browser.evaluate("window.sameDocument") is True
            assert thread not in name and (workspace.name in name or "sleep" in name), name
            browser.wait_for(f"document.querySelector('a[href$=\"thread/{thread}\"]').closest('tr')"
                             f".textContent.includes('working')", what="the thread shown working")
            fleet_shot = browser.screenshot(tmp_path / "dashboard-live.png")

            # (c) a steer from the thread page's form: delivered once, shown acknowledged
            browser.click(f'a[href$="thread/{thread}"]', navigates=True)
            browser.wait_for_selector(STEER_FORM)
            assert browser.evaluate(LIVE_SYNCED) is True
            browser.fill(f"{STEER_FORM} textarea[name=text]", STEER)
            browser.click(f"{STEER_FORM} button[type=submit]:not([hx-post])")
            proposed = await wait_until(lambda: [e.intent for e in s.events(ev.IntentProposed)
                                                 if e.intent.text == STEER], "the page's steer in the ledger")
            assert len(proposed) == 1 and proposed[0].owner == OWNER and proposed[0].thread_id == thread
            intent = proposed[0].id
            assert (await s.wait_state(intent, SETTLED)).state == "acknowledged"
            browser.wait_for("document.getElementById('result').textContent.includes('acknowledged')",
                             what="the steer shown acknowledged")
            # the only steer of the session, sent once (the trace keeps no message text)
            assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]
            assert len([m for m in s.user_messages(thread) if STEER in json.dumps(m["item"])]) == 1

            # (d) one click on a verdict records one label of that intent
            browser.click('#result form[hx-post$="action/label"] button[value="useful"]')
            labels = await wait_until(lambda: s.events(ev.OwnerLabeled), "the label in the ledger")
            assert [(label.subject, label.verdict) for label in labels] == [(f"intent:{intent}", "useful")]
            await s.turn_completed(thread, turn)
            # the daemon's record of the end first (a loaded machine delays it), then the page's
            await wait_until(lambda: s.projection().snapshot(thread).turn_state(turn) == "completed",
                             "the daemon to record the turn completed", timeout=60)
            browser.wait_for("document.querySelector('section.turns tbody td:nth-child(2)')?.textContent === 'completed'",
                             what="the turn shown completed, without a reload")
            browser.evaluate("window.scrollTo(0, 0)")  # the page from its top, as it opens
            thread_shot = browser.screenshot(tmp_path / "dashboard-thread.png")

            # (f) the hostile thread's markup is text; nothing of it ran
            browser.navigate(f"{base}/thread/{hostile}")
            shown_name = browser.wait_for("document.querySelector('h1.thread-name')?.textContent", what="the thread's name")
            assert SCRIPT in shown_name, shown_name  # the markup as text
            shown = browser.evaluate("({pwned: typeof window.pwned, images: document.querySelectorAll('img').length,"
                                     " scripts: [...document.scripts].filter(e => !e.src).length})")
            assert shown == {"pwned": "undefined", "images": 0, "scripts": 0}
            # its commands are listed with the thread's tool calls, their markup as text (the daemon
            # keeps payloads, so the ledger holds each command line, not only its digest)
            calls = browser.evaluate("[...document.querySelectorAll('section.calls tbody tr')]"
                                     ".map(r => [r.querySelector('code.command')?.textContent ?? '',"
                                     " r.textContent.replace(/\\s+/g, ' ').trim()])")
            assert len(calls) == 2 and all(SCRIPT in command and "<img src=x onerror=" in command and "completed" in row
                                           for command, row in calls), calls
            # and the agent's messages, kept as text too
            said = browser.evaluate("[...document.querySelectorAll('section.said li.message p.text')]"
                                    ".map(p => p.textContent)")
            assert said, "no agent message shown"
            browser.wait_for("true")  # one more round trip: the page's last events have arrived
            print("CSP violations reported:", browser.csp_violations)
            print("console errors:", browser.console_errors)
            assert browser.exceptions == []  # no page of the walk threw

    # (e) with the daemon stopped only the dashboard could write: refused requests write nothing
    with dashboard(ledger) as login:
        base = login.split("?", 1)[0].rstrip("/")
        before = head_seq(ledger)
        label = {"subject": f"intent:{intent}", "verdict": "harmful"}
        statuses = refusals(base, login, label)
        assert statuses == dict.fromkeys(statuses, 403), statuses
        assert head_seq(ledger) == before
        with httpx.Client() as owner:  # the same label, asked rightly, is recorded
            csrf = page_csrf(owner.get(login, follow_redirects=True).text)
            taken = owner.post(f"{base}/action/label", headers={"origin": origin_of(base), **csrf}, data=label)
        assert taken.status_code == 200 and head_seq(ledger) == before + 1, taken.text
    if os.environ.get("TILLERMAN_UPDATE_DOCS"):  # how the docs' screenshots are made
        shutil.copyfile(fleet_shot, DOCS / "dashboard-live.png")
        shutil.copyfile(thread_shot, DOCS / "dashboard-thread.png")
