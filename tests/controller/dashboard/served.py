"""``tillerman dashboard`` as its owner runs it: a subprocess serving a ledger (a SQLite
file or a ``postgresql://`` URL) on a free port, signed in through the URL it prints,
followed over real HTTP. Shared by the tests of each backend, so that both go through
the same login, the same event stream and the same guarded POSTs."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from tillerman.controller.dashboard import secret as secrets_file
from tillerman.controller.dashboard.guard import CSRF_HEADER, csrf_token
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope

#: How long the client waits for a response, or for the next line of the event stream: a
#: commit by another connection reaches it in well under a second; this is for a busy machine.
PATIENCE = 30.0


def started(thread_id: str, n: int = 0) -> Envelope:
    return Envelope(event_id=f"{thread_id}:{n}", event=ev.ThreadStarted(thread_id=thread_id, cwd="/work"),
                    source="appserver", at=1_700_000_000.0 + n)


@dataclass(frozen=True)
class Served:
    """A signed-in client of a running dashboard."""

    client: httpx.Client
    page: httpx.URL  # the fleet page, under the secret root, reached after the login redirect
    secret: str
    process: subprocess.Popen  # the running ``tillerman dashboard``

    def headers(self) -> dict[str, str]:
        """What the page's forms send with a POST: its Origin (scheme and host of the
        page's URL) and the CSRF token the page carries."""
        return {"origin": f"{self.page.scheme}://{self.page.netloc.decode()}", CSRF_HEADER: csrf_token(self.secret)}

    def post(self, action: str, form: dict[str, str], headers: dict[str, str]) -> httpx.Response:
        return self.client.post(str(self.page.join(f"action/{action}")), data=form, headers=headers)


@contextlib.contextmanager
def serving(ledger: str, tmp_path: Path) -> Iterator[Served]:
    """``tillerman dashboard --ledger LEDGER --port 0 --json``, its secret file in
    ``tmp_path``, signed in; stopped with Ctrl-C afterwards, which must end it cleanly."""
    secret_file = tmp_path / "dashboard-secret"
    proc = subprocess.Popen([sys.executable, "-c", "from tillerman.controller.cli.main import main; main()",
                             "dashboard", "--ledger", ledger, "--port", "0", "--secret-file", str(secret_file),
                             "--json"], stdout=subprocess.PIPE, text=True)
    try:
        printed = []
        while (line := proc.stdout.readline()) and line != "}\n":  # the startup object, printed indented
            printed.append(line)
        assert printed, f"the dashboard printed no startup line (exit {proc.poll()})"
        url = json.loads("".join(printed) + "}")["url"]
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        with httpx.Client(timeout=PATIENCE, follow_redirects=True) as client:
            login = client.get(url)  # follows the redirect, keeps the cookie
            assert login.status_code == 200 and "?token" not in str(login.url)
            yield Served(client=client, page=login.url, secret=secrets_file.load(secret_file), process=proc)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=PATIENCE) == 0  # Ctrl-C ends it cleanly


def next_change(lines: Iterator[str]) -> int:
    """The seq of the next ``change`` event of an event stream's lines (keepalives and
    blank lines passed over)."""
    for line in lines:
        if line == "event: change":
            seq = next(lines)
            assert seq.startswith("id: "), seq
            return int(seq.removeprefix("id: "))
    raise AssertionError("the event stream ended before a change")
