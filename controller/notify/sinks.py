"""Handing notices to sinks: a command's stdin, or a webhook's POST body.

The I/O edge of ``tillerman.controller.notify.notices``. Each sink has its own task and queue,
so a sink that hangs or fails holds up only its own notices, never the brain or a
dispatch. Every attempt is recorded (``notification_sent``, ``notification_failed``
with when the next attempt follows); a failed one is retried with growing delays, and
after ``MAX_ATTEMPTS`` the sink is given up on for those notices.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable

import anyio

from tillerman.controller.core.intent_requests import SOURCE
from tillerman.controller.notify.notices import Handover
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.events import Envelope, NotificationFailed, NotificationSent
from tillerman.ledger.recorder import Recorder
from tillerman.monitor.appserver_client import backoff_delays
from tillerman.rules.errors import show
from tillerman.rules.notify import NotifySink, is_loopback

log = logging.getLogger("tillerman")

MAX_ATTEMPTS = 5
RETRY_FIRST = 2.0  # seconds before the second attempt; doubled each time after
RETRY_MAX = 300.0
QUEUE = 1000  # hand-overs waiting per sink before new ones are dropped (and logged)


class SinkRunner:
    def __init__(self, sinks: Iterable[NotifySink], recorder: Recorder, *, clock: Callable[[], float],
                 wake: Callable[[], None]) -> None:
        self.recorder = recorder
        self.clock = clock
        self.wake = wake  # the brain folds what was recorded
        self._queues = {sink.name: anyio.create_memory_object_stream[Handover](QUEUE) for sink in sinks}

    def hand(self, handovers: Iterable[Handover]) -> None:
        """Queue each hand-over for its sink; never waits. A sink ``QUEUE`` hand-overs
        behind is given up on for the new ones (recorded, so they count as handled)."""
        for handover in handovers:
            try:
                self._queues[handover.sink.name][0].send_nowait(handover)
            except anyio.WouldBlock:
                log.error("notify sink %s is backing up; dropped the notices %s", handover.sink.name,
                          ", ".join(handover.keys))
                self._record(handover, NotificationFailed(
                    thread=handover.thread_id, sink=handover.sink.name, keys=handover.keys, attempt=0,
                    error=f"{QUEUE} hand-overs were already waiting for this sink", retry_in=None))

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for _, receive in self._queues.values():
                tg.start_soon(self._serve, receive)

    async def _serve(self, receive) -> None:
        async for handover in receive:
            await self.deliver(handover)

    async def deliver(self, handover: Handover) -> None:
        """Try until the sink takes it, or ``MAX_ATTEMPTS`` failed."""
        sink, body = handover.sink, json.dumps(handover.payload()).encode()
        delays = backoff_delays(initial=RETRY_FIRST, maximum=RETRY_MAX)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = time.monotonic()
            error = f"no answer within {sink.timeout:g}s; stopped it"
            with anyio.move_on_after(sink.timeout):
                error = await _send(sink, body)
            if error is None:
                self._record(handover, NotificationSent(
                    thread=handover.thread_id, sink=sink.name, keys=handover.keys, attempt=attempt,
                    wall_ms=round((time.monotonic() - started) * 1000)))
                return
            retry_in = next(delays) if attempt < MAX_ATTEMPTS else None
            then = f"retrying in {retry_in:g}s" if retry_in is not None else "giving up on these notices"
            log.warning("notify sink %s failed (attempt %d): %s; %s", sink.name, attempt, error, then)
            self._record(handover, NotificationFailed(
                thread=handover.thread_id, sink=sink.name, keys=handover.keys, attempt=attempt,
                error=error[-300:], retry_in=retry_in))
            if retry_in is None:
                return
            await anyio.sleep(retry_in)

    def _record(self, handover: Handover, event: NotificationSent | NotificationFailed) -> None:
        try:
            self.recorder.append([Envelope(event_id=f"notify:{uuid.uuid4().hex}", event=event, source=SOURCE,
                                           at=self.clock())])
        except OperationalError as exc:  # sent (or not) all the same: said once more after a restart
            log.error("ledger not writable (%s): the outcome for notices %s is not recorded", exc,
                      ", ".join(handover.keys))
        self.wake()


async def _send(sink: NotifySink, body: bytes) -> str | None:
    """None when the sink took the notices, else what went wrong in one line."""
    if sink.webhook is not None:
        return await anyio.to_thread.run_sync(_post, sink.webhook, body, sink.timeout, abandon_on_cancel=True)
    command = sink.shell if sink.shell is not None else list(sink.command or ())
    done, error = None, None
    try:
        done = await anyio.run_process(command, input=body, check=False, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE)
    except* (OSError, anyio.BrokenResourceError) as failed:  # could not start, or left stdin unread
        error = f"could not take the notices: {failed.exceptions[0]!r}"
    if done is None:
        return error
    if done.returncode:
        return f"exited {done.returncode}: {done.stderr.decode(errors='replace')[-200:].strip()}"
    return None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the sink's answer, not a hop to take: the loopback rule
    (``tillerman.rules.notify.check_webhook``) judged the URL written in the config, and a
    redirect would carry the notices (as a GET, the body dropped) to a host it never saw."""

    def redirect_request(self, *args, **kwargs) -> None:
        return None  # the opener then raises the 3xx as an HTTPError


def _opener(url: str) -> urllib.request.OpenerDirector:
    """No redirects; and for a loopback URL no proxy either (``$http_proxy`` would send
    the notices off this machine as surely as a redirect)."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
    if is_loopback(urllib.parse.urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def _post(url: str, body: bytes, timeout: float) -> str | None:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with _opener(url).open(request, timeout=timeout) as answer:  # noqa: S310 (http(s) only: rules.notify)
            answer.read()
    except urllib.error.HTTPError as exc:
        return _http_failure(exc.code, exc.reason, exc.headers.get("Location") if exc.headers else None)
    except (urllib.error.URLError, OSError) as exc:
        return f"cannot reach {url}: {getattr(exc, 'reason', exc)}"
    return None


def _http_failure(code: int, reason: str, location: str | None) -> str:
    """One line for an answer that is not a success; a redirect's target shown quoted and
    escaped, like a reason that is not plain text (both came from the sink, and reach
    logs and ``tillerman intents``)."""
    reason = reason if reason.isprintable() else show(reason)
    if 300 <= code < 400:
        where = f" to {show(location)}" if location is not None else ""
        return f"HTTP {code} {reason}: redirected{where}; redirects are not followed, write the final URL in the sink"
    return f"HTTP {code} {reason}"
