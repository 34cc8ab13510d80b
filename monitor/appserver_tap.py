"""The app-server tap, sans-IO: what to record, and which threads to subscribe to,
for each message one shared Codex app-server sends.

Discovery follows what the real server does (reference A1): ``thread/started`` and
``thread/status/changed`` are broadcast to every connection, subscribed or not, but
``thread/resume`` fails before a thread's first turn (its rollout does not exist
yet). So a thread is subscribed at its first ``active`` status, and a supervisor
that starts late lists the loaded threads and subscribes to each that runs a turn.
Resume is idempotent on the server; the tap still asks once per thread and connection.

Observing never starts work: on an idle thread ``thread/resume`` makes the server
continue the thread's active goal (a turn starts ~15 ms after the reply; every
release from 0.153.4 to 0.171.0), so an idle thread is only read (``thread/read``,
``thread/turns/list``: neither wakes anything) and subscribed to at its next
``active`` status (``resume_wakes_nothing``).

Event ids are natural keys (thread, turn, item, step, status), so the same fact
seen again after a reconnect, or through a second connection, is stored once.
A frame that does not parse, or a message whose fields have the wrong types, is
quarantined (``offset`` is the message's position on this connection, ``length``
its size in bytes where known) — never fatal.
"""

from __future__ import annotations

import hashlib

import msgspec

from tillerman.ledger.events import Envelope, Event, Quarantined, StatusChanged, ThreadStarted, TurnCompleted
from tillerman.monitor.appserver_events import AppServerEvents, HotNotification, natural_key
from tillerman.monitor.codex_wire import RUNNING
from tillerman.ledger.command_patterns import DEFAULT, CommandPatterns
from tillerman.ledger.usage import UsageRefused
from tillerman.monitor.jsonrpc import BadMessage, Notification, ServerRequest
from tillerman.monitor.parser import EARLIEST, LATEST, WrongType

_MALFORMED = (WrongType, TypeError, AttributeError, KeyError, ValueError)


def resume_wakes_nothing(status: str | None) -> bool:
    """Whether ``thread/resume`` may go to a loaded thread with this status: only while a
    turn runs in it. On an idle thread the resume continues an active goal (Codex's
    ``continue_active_goal_if_idle``), which does nothing while a turn runs; an unknown
    status is taken for idle."""
    return status == RUNNING


class TapOutput(msgspec.Struct, frozen=True):
    envelopes: list[Envelope]
    resume: list[str]  # thread ids to subscribe to now


class AppServerTap:
    def __init__(self, server: str, *, patterns: CommandPatterns = DEFAULT, retain_payloads: bool = False) -> None:
        self.source = f"appserver:{server}"
        self._mapping = AppServerEvents(patterns=patterns, retain_payloads=retain_payloads)
        self._asked: set[str] = set()  # threads a resume was sent for on this connection
        self._idle: set[str] = set()  # threads read but left unsubscribed until their next `active`
        # thread id -> whether it is the user's work (False: Codex's ephemeral housekeeping,
        # never subscribed to); kept across connections, since a thread never changes kind
        self._users_work: dict[str, bool] = {}
        self._position = 0  # messages received on this connection: quarantine evidence
        # Why this connection's server does not answer ``account/usage/read`` (no such
        # method, or no account signed in): asked no more until the next connection.
        self.account_usage_refused: str | None = None

    def use_patterns(self, patterns: CommandPatterns) -> None:
        """Classify commands with these patterns from now on (a reloaded configuration)."""
        self._mapping.patterns = patterns

    def connected(self) -> None:
        """A new connection: its subscriptions start empty."""
        self._asked.clear()
        self._idle.clear()
        self._position = 0
        self.account_usage_refused = None

    def receive(self, message: Notification | ServerRequest | BadMessage | HotNotification, now: float) -> TapOutput:
        """What to record for one message, as ``RpcSession`` decoded it, or as
        ``decode_hot`` did (the same envelopes for the same frame)."""
        position = self._position
        self._position += 1
        if isinstance(message, HotNotification):
            try:
                events = self._mapping.typed(message)
            except UsageRefused as refused:  # a typed decode checks types, not figures
                return TapOutput([self._quarantine(position, 0, refused.reason, now)], [])
            if not events:
                return TapOutput([], [])
            emitted = message.params.startedAtMs if message.emittedAtMs is msgspec.UNSET else message.emittedAtMs
            return self._output(events, emitted, now)
        if isinstance(message, BadMessage):
            length = len(message.frame) if isinstance(message.frame, str | bytes) else 0
            return TapOutput([self._quarantine(position, length, f"bad_message: {message.reason}", now)], [])
        raw = message.raw
        try:
            events = self._mapping.normalize(raw)
        except UsageRefused as refused:
            return TapOutput([self._quarantine(position, 0, refused.reason, now)], [])
        except _MALFORMED as exc:
            return TapOutput([self._quarantine(position, 0, f"wrong_type: {exc}", now)], [])
        # The server's own time keeps a re-sent fact identical (an approval request is
        # re-sent on every resume; it has no emittedAtMs, but its startedAtMs stays put).
        params = raw.get("params") if isinstance(raw.get("params"), dict) else {}
        return self._output(events, raw.get("emittedAtMs", params.get("startedAtMs")), now)

    def _output(self, events: list[Event], emitted, now: float) -> TapOutput:
        timed = isinstance(emitted, int | float) and not isinstance(emitted, bool)
        # A time out of any calendar (or beyond a double) is no time: ours stands in.
        at = emitted / 1000 if timed and EARLIEST * 1000 <= emitted <= LATEST * 1000 else now
        self._learn(events)
        resume = [e.thread_id for e in events if self._should_resume(e)]
        return TapOutput([self._envelope(e, at, emitted) for e in events], resume)

    def loaded(self, thread_ids: list[str]) -> list[str]:
        """After a (late) start: every loaded thread not yet subscribed."""
        fresh = [t for t in thread_ids if t not in self._asked]
        self._asked.update(fresh)
        return fresh

    def following(self) -> frozenset[str]:
        """The user's threads this connection subscribed to, or waits to subscribe to at their
        next turn (what this daemon sees)."""
        return frozenset(t for t in self._asked | self._idle if self._users_work.get(t) is not False)

    def users_work(self, thread_id: str) -> bool | None:
        """Whether a thread is the user's work; None when this tap never saw what it is."""
        return self._users_work.get(thread_id)

    def read(self, result: dict) -> list[Envelope]:
        """A ``thread/read`` of a thread that started before we attached: what it is.
        No time stamp, so reading it again after a reconnect records nothing new."""
        try:
            events = self._mapping.response("thread/read", result)
        except _MALFORMED:
            return []
        self._learn(events)
        return [self._envelope(e, None, None) for e in events if e.thread_id is not None]

    def goal(self, result: dict, now: float) -> list[Envelope]:
        """A ``thread/goal/get`` of a thread left unsubscribed (idle): its goal, as the goal
        snapshot that follows a resume would have said it."""
        try:
            events = self._mapping.response("thread/goal/get", result)
        except _MALFORMED:
            return []
        return [self._envelope(e, now, None) for e in events]

    def account_usage_wanted(self, events: list[Envelope]) -> list[tuple[str, str]]:
        """The (thread, turn) of each of the user's turns these envelopes end, whose
        ``account/usage/read`` to ask for: none once the server refused it."""
        if self.account_usage_refused is not None:
            return []
        return [(e.event.thread_id, e.event.turn_id) for e in events if isinstance(e.event, TurnCompleted)
                and e.event.thread_id is not None and e.event.turn_id is not None
                and self._users_work.get(e.event.thread_id) is not False]

    def account_usage(self, result: dict, turn_id: str, now: float) -> list[Envelope]:
        """The server's estimate of a thread's cost, read at the end of ``turn_id``; one
        per turn (a second read of the same turn records nothing). A figure that cannot
        be counted is quarantined with its reason."""
        try:
            events = self._mapping.account_usage(result, turn_id)
        except UsageRefused as refused:
            return [self._quarantine(self._position, 0, refused.reason, now)]
        except _MALFORMED as exc:
            return [self._quarantine(self._position, 0, f"wrong_type: {exc}", now)]
        return [self._envelope(e, now, None) for e in events]

    def resumed(self, result: dict, now: float) -> list[Envelope]:
        """The in-progress turn a resume reveals (its start went by unseen)."""
        try:
            events = self._mapping.response("thread/resume", result)
        except _MALFORMED:
            return []
        return [self._envelope(e, now, None) for e in events]

    def subscribe_when_active(self, thread_id: str) -> None:
        """Ask at the thread's next ``active``: it is idle (a resume now would start its goal's
        work), or the resume failed (e.g. before its first turn)."""
        self._asked.discard(thread_id)
        self._idle.add(thread_id)

    def _learn(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, ThreadStarted) and event.thread_id is not None:
                self._users_work[event.thread_id] = event.users_work

    def _should_resume(self, event: Event) -> bool:
        if not isinstance(event, StatusChanged) or event.status != "active" or event.thread_id is None:
            return False
        if event.thread_id in self._asked or self._users_work.get(event.thread_id) is False:
            return False
        self._asked.add(event.thread_id)
        self._idle.discard(event.thread_id)
        return True

    def _envelope(self, event: Event, at: float | None, discriminator) -> Envelope:
        key = natural_key(event, discriminator)
        return Envelope(event_id="a-" + hashlib.sha256(key.encode()).hexdigest()[:32], event=event,
                        source=self.source, at=at)

    def _quarantine(self, offset: int, length: int, reason: str, now: float) -> Envelope:
        event = Quarantined(source=self.source, offset=offset, length=length, reason=reason[:200])
        ident = hashlib.sha256(f"{self.source}|{now}|{offset}".encode()).hexdigest()[:32]
        return Envelope(event_id="q-" + ident, event=event, source=self.source, at=now, offset=offset, length=length)
