"""``tillerman claude``: a transparent stdio wrapper a harness runs in place of
``claude -p --input-format stream-json --output-format stream-json``.

It starts the CLI with the harness's arguments (adding the stream-json flags when
they are missing), relays every byte both ways unchanged (a line too long to hold
whole, ``relay.CliFramer``, goes on in pieces, quarantined), records what the
CLI writes as normalized events (``tillerman.monitor.claude_stream``) under the source
``claude-wrapper:<run>``, which makes the session steerable, and carries out the
intents the daemon decided for that session. The relay's state (turns, running
tools, our messages and requests, what goes on to the harness) is
``tillerman.controller.claude.relay``'s; this module does the I/O.

The daemon stays the only place that decides: the wrapper follows the ledger's
change feed (``Recorder.change_feed``, as the daemon does), looks at the ledger at least
every ``POLL_INTERVAL`` besides, and claims an intent whose latest decision
dispatches it, through the same delivery machine and driver as the Codex adapter
(``tillerman.controller.core.delivery``, ``tillerman.controller.dispatch.driver``): the durable
``dispatch_unknown`` record with its attempt token first, the boundary checks
(``tillerman.controller.core.boundary``) against the ledger, then the write to the CLI.
A steer is claimed only while a tool call of its expected turn runs (the CLI folds
it in at that call's result); a queued message goes with ``priority: "later"``; an
interrupt is the ``interrupt`` control request. The CLI's acknowledgement
(``command_lifecycle`` ``queued``, the ``control_response``) is the accept; only its
evidence of delivery (the lifecycle ``started`` inside the turn, a turn's
``user_message_uuids``) acknowledges an intent. A turn that ended with our steer
unsettled is read back from the session's transcript (``ReadBack``), and so is every
intent under way when a wrapper starts on a resumed session (``--resume``).

Permission requests (``can_use_tool``) go to the harness untouched; the wrapper never
answers one. The driver's crash points (``TILLERMAN_KILL_AT``) hold here as in the daemon.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from tillerman.controller.claude.relay import CliFramer, Echo, Ours, Piece, Relay, cli_record, message_uuid
from tillerman.controller.core.commands import Command, Interrupt, ListTerminals, QueueAdd, QueueList, ReadBack, Steer
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, Fact, NoAnswer, Replied
from tillerman.controller.core.intent_requests import evidence_envelope, intent_view, transition_envelope
from tillerman.controller.core.reconcile import as_intent_names, observed, reconcile_fact, turn_items, under_way
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.controller.dispatch.driver import StaleDelivery, carry_out, kill_at
from tillerman.ledger import events as ev
from tillerman.ledger.errors import IllegalTransition, OperationalError
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import CLAUDE_WRAPPER_SOURCE, IntentView, Projection
from tillerman.ledger.recorder import Recorder
from tillerman.monitor import codex_wire as wire
from tillerman.monitor.claude_stream import ClaudeStreamParser
from tillerman.monitor.claude_transcript import ClaudeTranscriptParser
from tillerman.monitor.digest import digest
from tillerman.monitor.lines import MAX_LINE
from tillerman.monitor.parser import Parsed
from tillerman.monitor.tailer import file_envelope, file_source
from tillerman.rules.ruleset import RuleSet, ruleset_from_text

log = logging.getLogger("tillerman")

CLAUDE_BIN_ENV = "TILLERMAN_CLAUDE_BIN"
ANSWER_TIMEOUT = 10.0  # seconds the CLI has to acknowledge a message or answer a request
POLL_INTERVAL = 1.0  # the longest sleep between two looks at the ledger: a net under the change feed
CHUNK = 1 << 16  # bytes read from the CLI's stdout at a time
_STREAM_FLAGS = (("--input-format", "stream-json"), ("--output-format", "stream-json"))
_PAST_EXPIRY = ("report_overdue", "expires_at_passed")  # the daemon's decision on a queued intent past expiry
_OBSERVED = (ev.UserMessage, ev.AgentMessage, ev.TurnStarted, ev.TurnCompleted, ev.ItemStarted, ev.ItemCompleted)


class WrapperError(Exception):
    """The CLI cannot be started; the message says what to do."""


def claude_command(args: Sequence[str]) -> list[str]:
    """The CLI (``$TILLERMAN_CLAUDE_BIN``, else ``claude`` on PATH) with the harness's
    arguments, plus the stream-json flags the wrapper needs when they are missing."""
    binary = os.environ.get(CLAUDE_BIN_ENV) or shutil.which("claude")
    if not binary:
        raise WrapperError(f"claude is not on PATH; install Claude Code or set {CLAUDE_BIN_ENV} to its binary")
    extra: list[str] = []
    for flag, value in _STREAM_FLAGS:
        if flag not in args:
            extra += [flag, value]
    if "--verbose" not in args:  # the CLI refuses stream-json output without it
        extra.append("--verbose")
    return [binary, *extra, *args]


def resumed_session(args: Sequence[str]) -> str | None:
    """The session ``--resume ID`` (or ``-r ID``, ``--resume=ID``) names, if any."""
    for index, arg in enumerate(args):
        if arg.startswith("--resume="):
            return arg.split("=", 1)[1]
        if arg in ("--resume", "-r") and index + 1 < len(args):
            return args[index + 1]
    return None


def transcript_path(home: Path, cwd: str, session_id: str) -> Path:
    """Where the CLI writes a session's transcript: every non-alphanumeric character of
    the cwd becomes ``-``."""
    return home / ".claude" / "projects" / re.sub(r"[^A-Za-z0-9]", "-", cwd) / f"{session_id}.jsonl"


def transcript_aliases(path: Path) -> dict[str, str]:
    """Each turn of the transcript (by the uuid of its first message, stream-json's id)
    → the id the hooks give it (``promptId``), as the transcript's own ``TurnAlias``
    events say."""
    parser = ClaudeTranscriptParser(file_source(path))
    parsed = parser.feed(path.read_bytes()) + parser.close()
    return {p.event.turn_id: p.event.alias for p in parsed if isinstance(p.event, ev.TurnAlias) and p.event.turn_id}


def transcript_turns(path: Path, uuid_: str, client_id: str) -> wire.TurnPage:
    """The session's turns as its transcript records them, newest first, with our
    message where the CLI took it: folded into a turn (the ``queued_command``
    attachment and the queue's ``absorbed_mid_turn``) or opening its own (the turn's
    id is its first message's uuid)."""
    parser = ClaudeTranscriptParser(file_source(path))
    parsed = parser.feed(path.read_bytes()) + parser.close()
    status: dict[str, str] = {}
    ours: set[str] = {uuid_}
    for event in (p.event for p in parsed):
        if isinstance(event, ev.TurnStarted) and event.turn_id:
            status.setdefault(event.turn_id, wire.IN_PROGRESS)
        elif isinstance(event, ev.TurnCompleted) and event.turn_id:
            status[event.turn_id] = event.status
        elif isinstance(event, ev.QueueEntryRemoved) and event.outcome == "delivered" and event.client_id == uuid_:
            ours.add(event.turn_id or "")
    item = (wire.TurnItem(type="userMessage", id=uuid_, client_id=client_id),)
    turns = [wire.Turn(id=turn, status=state, items=item if turn in ours else ()) for turn, state in status.items()]
    return wire.TurnPage(turns=tuple(reversed(turns)))


class ClaudeAdapter(GuardedAdapter):
    """The guarded adapter's boundary checks, with the wrapper's CLI as the transport."""

    def __init__(self, wrapper: Wrapper, ruleset: RuleSet) -> None:
        super().__init__(None, wrapper.recorder, ruleset, snapshot=wrapper.projection.snapshot,
                         recorded_cwd=lambda thread_id: wrapper.cwd, clock=wrapper.clock)
        self.wrapper = wrapper

    async def execute(self, command: Command) -> Fact:
        view = self.check(command)
        return await self.wrapper.carry(command, view)

    async def _thread_cwd(self, thread_id: str) -> str | None:
        return self.wrapper.cwd  # the CLI's, from its system/init


class Wrapper:
    def __init__(self, recorder: Recorder, args: Sequence[str], *, retain_payloads: bool = False,
                 clock=time.time, max_line: int = MAX_LINE) -> None:
        self.recorder = recorder
        self.clock = clock
        self.relay = Relay()
        self.run_id = uuid.uuid4().hex
        self.source = f"{CLAUDE_WRAPPER_SOURCE}:{self.run_id}"
        self.parser = ClaudeStreamParser(self.source, retain_payloads=retain_payloads, max_line=max_line)
        self.framer = CliFramer(max_line)
        self.session: str | None = resumed_session(args)
        self.resuming = self.session is not None
        self.cwd: str | None = None
        self.home = Path(os.environ.get("HOME") or Path.home())
        self.projection = Projection()
        self.ruleset: RuleSet | None = None
        self.machines: dict[str, Delivery] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._acks: dict[str, anyio.Event] = {}  # our message uuid -> the CLI acknowledged it
        self._answers: dict[str, anyio.Event] = {}  # our request id -> answered
        self._answered: dict[str, dict[str, Any]] = {}
        self._withdrawn: set[str] = set()
        self._unaliased: set[str] = set()  # stream-json turns whose hooks' prompt_id is not recorded yet
        self._changed = anyio.Event()
        self._process: anyio.abc.Process | None = None
        self._write_lock = anyio.Lock()
        self._cli_gone = False

    # -- the process and the relay ------------------------------------------------------

    async def run(self, command: list[str]) -> int:
        self._refold()
        async with await anyio.open_process(command, stdin=-1, stdout=-1, stderr=None) as process:
            self._process = process
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._harness_to_cli)
                tg.start_soon(self._follow_ledger)
                tg.start_soon(self._deliveries, tg)
                await self._cli_to_harness(tg)
                tg.cancel_scope.cancel()
            return await process.wait()

    async def _harness_to_cli(self) -> None:
        stdin = sys.stdin.buffer
        while raw := await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True):
            self.relay.from_harness(raw)
            await self._write(raw)
        assert self._process is not None and self._process.stdin is not None
        async with self._write_lock:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._process.stdin.aclose()  # the CLI finishes its turns, then exits

    async def _write(self, raw: bytes) -> bool:
        """One whole line to the CLI; False when it is gone."""
        assert self._process is not None and self._process.stdin is not None
        async with self._write_lock:
            try:
                await self._process.stdin.send(raw)
                return True
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return False

    async def _cli_to_harness(self, tg) -> None:
        assert self._process is not None and self._process.stdout is not None
        while True:
            try:
                data = await self._process.stdout.receive(CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                break
            self.cli_output(tg, data)
        self.cli_ended(tg)

    def cli_output(self, tg, data: bytes) -> None:
        """Bytes the CLI wrote: on to the harness, each whole line once the relay says so."""
        for piece in self.framer.feed(data):
            self._piece(tg, piece, self.parser.feed(piece.data))

    def cli_ended(self, tg) -> None:
        """The CLI's stdout closed: a last line without its newline goes on and is read."""
        last = self.framer.close()
        if last is not None:
            self.parser.feed(last)  # held by the parser until it closes
        closing = self.parser.close()
        if last is not None:
            self._from_cli(tg, last, closing)
        else:  # at most the end of a line too long to hold, quarantined
            self._append(self._envelopes(closing))
        self._append(self._ended())
        self._cli_gone = True
        for event in [*self._acks.values(), *self._answers.values()]:
            event.set()  # nobody will answer now

    def _ended(self) -> list[Envelope]:
        """The session ended with the CLI (stream-json has no line saying so): the fleet
        shows it done until a resumed session runs a turn in it. Keyed by the time, as a
        session resumed and ended again ends once per run."""
        if self.session is None:
            return []
        at = self.clock()
        key = hashlib.sha256(f"{self.session}|ended|{at!r}".encode()).hexdigest()[:32]
        return [Envelope(event_id=f"cw-{key}", event=ev.StatusChanged(thread_id=self.session, status=ev.SESSION_ENDED),
                         source=self.source, at=at)]

    def _piece(self, tg, piece: Piece, parsed: list[Parsed]) -> None:
        if piece.whole:
            self._from_cli(tg, piece.data, parsed)
        else:  # part of a line too long to hold: never ours, so it goes on; the parser quarantines it
            _to_harness(piece.data)
            self._append(self._envelopes(parsed))

    def _from_cli(self, tg, raw: bytes, parsed: list[Parsed]) -> None:
        events = [p.event for p in parsed]
        out = self.relay.from_cli(raw, events)
        if out.forward:
            _to_harness(raw)
        for event in events:
            if isinstance(event, ev.ThreadStarted):
                self._session_known(tg, event.thread_id)
            if isinstance(event, ev.TurnStarted) and self.cwd is None:
                self.cwd = _init_cwd(raw)
        envelopes = self._turn_aliases(events) + self._envelopes(parsed)
        envelopes += [self._echo_envelope(echo, self.source) for echo in out.echoes]
        self._append(envelopes)
        for message in out.accepted:
            self._acks.setdefault(message, anyio.Event()).set()
        for request_id, response in out.answers:
            self._answered[request_id] = response
            self._answers.setdefault(request_id, anyio.Event()).set()
        for ours in out.withdraw:
            tg.start_soon(self._withdraw, ours, "turn_ended")
        for ours in out.cancelled:
            self._dropped(ours)
        self._observe(tg, [e.event for e in envelopes])
        self._changed.set()

    def _session_known(self, tg, session: str | None) -> None:
        if session is None or session == self.session and not self.resuming:
            return
        self.session = session
        if self.resuming:
            self.resuming = False
            tg.start_soon(self._reconcile_resumed, tg)

    # -- the ledger ---------------------------------------------------------------------

    def _append(self, envelopes: list[Envelope]) -> None:
        if not envelopes:
            return
        try:
            self.recorder.append(envelopes)
        except OperationalError as exc:  # the relay goes on: the harness never waits for the ledger
            log.error("ledger not writable (%s): %d event(s) of session %s not recorded",
                      exc, len(envelopes), self.session)

    def _envelopes(self, parsed: list[Parsed]) -> list[Envelope]:
        return [file_envelope(self.run_id, self.source, p) for p in parsed]

    def _turn_aliases(self, events: list[ev.Event]) -> list[Envelope]:
        """The hooks' ``prompt_id`` of each turn stream-json opened, read from the
        transcript's prompt line of that turn (its ``uuid`` is the stream's turn id, its
        ``promptId`` the hooks'): stdout names no ``prompt_id``, and without this tie a
        session seen through the wrapper and the hooks has each turn twice. Looked for
        from the turn's start on each line until found; a turn that ends unfound is
        looked for once more, then given up (no transcript: ``--no-session-persistence``)."""
        self._unaliased.update(e.turn_id for e in events if isinstance(e, ev.TurnStarted) and e.turn_id)
        path = self._transcript()
        found = transcript_aliases(path) if self._unaliased and path is not None and path.is_file() else {}
        envelopes = []
        for turn in sorted(self._unaliased & found.keys()):
            event = ev.TurnAlias(thread_id=self.session, turn_id=turn, alias=found[turn])
            key = hashlib.sha256(f"{self.session}|{turn}|alias".encode()).hexdigest()[:32]
            envelopes.append(Envelope(event_id=f"cw-{key}", event=event, source=self.source, at=self.clock()))
        self._unaliased -= found.keys() | {e.turn_id for e in events if isinstance(e, ev.TurnCompleted)}
        return envelopes

    def _echo_envelope(self, echo: Echo, source: str) -> Envelope:
        """Our message, where the CLI says it reached the model: the echo the delivery
        machine acknowledges from (a user message with our client id)."""
        view = self.projection.intents.get(echo.intent_id)
        text = view.intent.delivered_text if view else ""
        event = ev.UserMessage(thread_id=self.session, turn_id=echo.turn_id, digest=digest(text), size=len(text),
                               client_id=echo.client_id, item_id=echo.uuid)
        key = hashlib.sha256(f"{self.session}|{echo.uuid}|{echo.turn_id}".encode()).hexdigest()[:32]
        return Envelope(event_id=f"cw-{key}", event=event, source=source, at=self.clock())

    async def _follow_ledger(self) -> None:
        """Look at the ledger again on every commit to it by any process (the daemon
        deciding an intent for this session). A feed that cannot be had or can no longer
        tell (a database connection lost) leaves the look every ``POLL_INTERVAL``."""
        feed = None
        try:
            # Off the loop: a database's feed opens a connection of its own.
            feed = await anyio.to_thread.run_sync(self.recorder.change_feed)
            if feed is None:  # no other process can write the ledger
                return
            async for _ in feed:
                self._changed.set()
        except OperationalError as exc:
            log.warning("ledger changes not followed (%s): looking at the ledger every %.0fs", exc, POLL_INTERVAL)
        finally:
            if feed is not None:
                feed.close()

    def _refold(self) -> None:
        for entry in self.recorder.read(after_seq=self.projection.seq):
            self.projection.apply(entry)
            event = entry.envelope.event
            if isinstance(event, ev.RulesetLoaded) and event.ruleset_text is not None:
                with contextlib.suppress(Exception):  # a set this version cannot read: keep the last one
                    self.ruleset = ruleset_from_text(event.ruleset_text)

    # -- claiming decided intents -------------------------------------------------------

    async def _deliveries(self, tg) -> None:
        while True:
            with anyio.move_on_after(POLL_INTERVAL):
                await self._changed.wait()
            self._changed = anyio.Event()
            try:
                self._refold()
            except OperationalError as exc:
                log.error("ledger not readable (%s): nothing claimed until it is", exc)
                continue
            self._claim(tg)

    def _claim(self, tg) -> None:
        if self.session is None or self.ruleset is None or self.resuming or self._cli_gone:
            return
        for view in self.projection.open_intents():
            intent = view.intent
            if intent.thread_id != self.session or intent.id in self.machines or view.state != State.PROPOSED:
                continue
            decided = view.last_decision is not None and view.last_decision[0] == intent.mode
            if decided and self._ready(view):
                self._drive(tg, intent.id, self._dispatch_fact(intent))
        for ours in self.relay.queued():
            view = self.projection.intents.get(ours.intent_id)
            if view is not None and view.state in (State.EXPIRED, State.REJECTED):
                tg.start_soon(self._withdraw, ours, f"intent_{view.state}")
            elif view is not None and view.state == State.QUEUED and view.last_decision == _PAST_EXPIRY:
                # The daemon found it past expires_at. Codex cannot take an accepted
                # message back, so it only reports; the CLI can, and says so.
                tg.start_soon(self._withdraw, ours, "expires_at_passed")

    def _dispatch_fact(self, intent: Intent) -> Dispatch:
        """The turn running now, named as the intent names it: the relay knows it by
        stream-json's uuid, an intent proposed for ``active`` may name it by the hooks'
        ``prompt_id`` (the fold's id of the turn once the alias ties the two). Named by the
        relay's id, a steer that follows the active turn took the running turn for another,
        older one and was never sent."""
        snapshot = self.projection.snapshot(intent.thread_id)
        running = as_intent_names(snapshot, intent, self.relay.turn)
        started = snapshot.active_turn_started_at if snapshot.same_turn(snapshot.active_turn_id, running) else None
        return Dispatch(self.clock(), uuid.uuid4().hex, running, started)

    def _ready(self, view: IntentView) -> bool:
        intent = view.intent
        if intent.mode == "steer":
            return self.relay.steer_ready(self._turn_ids(intent.thread_id, intent.expected_turn_id))
        if intent.mode == "interrupt":
            return self.relay.running(self._turn_ids(intent.thread_id, intent.expected_turn_id))
        return True

    def _turn_ids(self, thread_id: str, turn_id: str | None) -> tuple[str, ...]:
        """Every id the session's sources give ``turn_id``'s turn: the intent may name it by
        the hooks' ``prompt_id``, stream-json names it by its first message's uuid."""
        return self.projection.snapshot(thread_id).turn_ids(turn_id)

    def _observe(self, tg, events: list[ev.Event]) -> None:
        for event in events:
            if isinstance(event, _OBSERVED) and event.thread_id == self.session:
                snapshot = self.projection.snapshot(event.thread_id)
                for machine in list(self.machines.values()):
                    if not machine.finished:
                        self._drive(tg, machine.intent.id, observed(snapshot, machine.intent, event, self.clock()))

    def _drive(self, tg, intent_id: str, fact: Fact) -> None:
        if intent_id not in self.machines:
            self.machines[intent_id] = self._machine(intent_id)
        tg.start_soon(self._carry_out, intent_id, fact)

    def _machine(self, intent_id: str) -> Delivery:
        view = intent_view(self.recorder, intent_id)
        return Delivery.from_view(view, turn_items=turn_items(self.projection, view))

    async def _carry_out(self, intent_id: str, fact: Fact) -> None:
        """One fact for one intent, in order (a lock per intent), as the daemon does."""
        async with self._locks.setdefault(intent_id, anyio.Lock()):
            machine = self.machines.get(intent_id)
            if machine is None or self.ruleset is None:
                return
            try:
                await carry_out(machine, fact, self.recorder, ClaudeAdapter(self, self.ruleset), kill_at)
            except (IllegalTransition, StaleDelivery) as exc:
                log.info("intent %s moved elsewhere (%s): rebuilding its machine from the ledger", intent_id, exc)
                self.machines[intent_id] = self._machine(intent_id)
            except OperationalError as exc:
                log.error("intent %s: ledger not writable (%s); nothing sent", intent_id, exc)
                self.machines[intent_id] = self._machine(intent_id)
            self._changed.set()

    # -- the transport ------------------------------------------------------------------

    async def carry(self, command: Command, view: IntentView) -> Fact:
        """Carry out one command the boundary cleared; its outcome as a delivery fact."""
        intent, now = view.intent, self.clock
        match command:
            case Steer() | QueueAdd():
                steer = isinstance(command, Steer)
                ours, line = self.relay.message(
                    intent.client_user_message_id, intent.id, command.text, priority=None if steer else "later",
                    expected_turns=self._turn_ids(intent.thread_id, command.expected_turn_id) if steer else ())
                waiting = self._acks.setdefault(ours.uuid, anyio.Event())
                if not await self._write(line):
                    return NoAnswer(command, "disconnected", now(), {"detail": "the CLI's stdin is closed"})
                if not await self._wait(waiting) or self._cli_gone and ours.state == "sent":
                    return NoAnswer(command, "timeout" if not self._cli_gone else "disconnected", now())
                reply = (wire.SteerAccepted(turn_id=self.relay.turn) if isinstance(command, Steer)
                         else wire.QueuedSubmission(id=ours.uuid))
                return Replied(command, reply, now())
            case Interrupt():
                request_id, line = self.relay.control("interrupt", **(
                    {"cancel_queued": True} if intent.cancel_queued else {}))
                waiting = self._answers.setdefault(request_id, anyio.Event())
                if not await self._write(line):
                    return NoAnswer(command, "disconnected", now(), {"detail": "the CLI's stdin is closed"})
                if not await self._wait(waiting) or request_id not in self._answered:
                    return NoAnswer(command, "timeout" if not self._cli_gone else "disconnected", now())
                answer = self._answered.pop(request_id)
                self._record_answer(intent, "interrupt_answered", request_id, answer)
                return Replied(command, wire.InterruptAccepted(), now())
            case QueueList():
                # An interrupt never pauses the CLI's queue (what it cancelled is in the
                # control_response's evidence); for an add, what the CLI has queued of ours.
                entries = () if intent.mode == "interrupt" else tuple(
                    wire.QueueEntry(id=o.uuid, client_user_message_id=o.client_id) for o in self.relay.queued())
                return Replied(command, wire.QueuePage(entries=entries), now())
            case ListTerminals():
                return Replied(command, wire.TerminalList(terminals=()), now())  # the CLI ends its own tool
            case ReadBack():
                return self._read_back(command, intent.client_user_message_id)
        raise TypeError(f"{type(command).__name__} has no Claude Code transport")

    async def _wait(self, event: anyio.Event) -> bool:
        with anyio.move_on_after(ANSWER_TIMEOUT):
            await event.wait()
            return True
        return False

    def _read_back(self, command: ReadBack, client_id: str) -> Fact:
        path = self._transcript()
        if path is None or not path.is_file():
            return NoAnswer(command, "unreadable_reply", self.clock(), {"detail": "no transcript to read back"})
        return Replied(command, transcript_turns(path, message_uuid(client_id), client_id), self.clock())

    def _transcript(self) -> Path | None:
        if self.session is None or self.cwd is None:
            return None
        return transcript_path(self.home, self.cwd, self.session)

    def _record_answer(self, intent, reason: str, request_id: str, answer: dict[str, Any]) -> None:
        response = _inner(answer)
        evidence = {"request_id": request_id, "subtype": str(answer.get("subtype")),
                    "still_queued": _count(response.get("still_queued")),
                    "cancelled": _count(response.get("cancelled"))}
        # An answer comes only after the durable dispatch record; the fold may not have
        # read that record back yet, and must not date the answer before it.
        view = self.projection.intents.get(intent.id)
        state = view.state if view and view.state != State.PROPOSED else State.DISPATCH_UNKNOWN
        self._append([evidence_envelope(intent, state, reason, evidence, f"{reason}:{request_id}", self.clock())])

    async def _withdraw(self, ours: Ours, why: str) -> None:
        """Take back a message of ours the CLI still holds queued (``cancel_async_message``)."""
        if ours.uuid in self._withdrawn:
            return
        self._withdrawn.add(ours.uuid)
        request_id, line = self.relay.control("cancel_async_message", message_uuid=ours.uuid)
        waiting = self._answers.setdefault(request_id, anyio.Event())
        answered = await self._write(line) and await self._wait(waiting) and request_id in self._answered
        answer = self._answered.pop(request_id, {}) if answered else {"subtype": "no_answer"}
        view = self.projection.intents.get(ours.intent_id)
        if view is not None:
            self._record_answer(view.intent, "withdrawn", request_id,
                                {**answer, "response": {**_inner(answer), "why": why}})
        self._changed.set()

    def _dropped(self, ours: Ours) -> None:
        """The CLI dropped a message of ours before it ran (``command_lifecycle``
        ``cancelled``): withdrawn past its expiry, or cleared by an interrupt that asked to
        cancel the queue. It will never run, so an accepted intent expires."""
        view = self.projection.intents.get(ours.intent_id)
        if view is None or view.state != State.QUEUED:
            return
        expired = view.last_decision == _PAST_EXPIRY and ours.uuid in self._withdrawn
        reason = "expires_at_passed" if expired else "lost_after_accept"
        envelope = transition_envelope(view.intent, State.QUEUED, State.EXPIRED, reason,
                                       {"dropped_by_cli": True, "message_uuid": ours.uuid}, self.clock())
        try:
            self.recorder.append([envelope], durable=True)
        except IllegalTransition as exc:  # it settled meanwhile (our message ran after all)
            log.info("intent %s moved before its withdrawal was recorded (%s)", view.intent.id, exc)
        except OperationalError as exc:
            log.error("intent %s: withdrawn, but the ledger is not writable (%s)", view.intent.id, exc)

    # -- a resumed session --------------------------------------------------------------

    async def _reconcile_resumed(self, tg) -> None:
        """The wrapper (or the CLI) before this one may have died with intents under way:
        what the transcript shows of them is recorded (the turns that ended, where our
        messages landed), then each is reconciled as the daemon does after a restart."""
        self._refold()
        path = self._transcript() if self.cwd else None
        if path is None:
            self.cwd = (self.projection.recorded_cwd(self.session) if self.session else None) or os.getcwd()
            path = self._transcript()
        views = [v for v in under_way(self.projection) if v.intent.thread_id == self.session]
        if path is not None and path.is_file() and views:
            self._append(self._transcript_facts(path, views))
            self._refold()
        for view in views:
            if view.intent.id not in self.machines:
                self._drive(tg, view.intent.id, reconcile_fact(self.projection, view, self.clock()))
        self._changed.set()

    def _transcript_facts(self, path: Path, views: list[IntentView]) -> list[Envelope]:
        source = file_source(path)
        parser = ClaudeTranscriptParser(source)
        parsed = parser.feed(path.read_bytes()) + parser.close()
        facts = [file_envelope(str(path), source, p) for p in parsed
                 if isinstance(p.event, ev.TurnStarted | ev.TurnCompleted)]
        for view in views:
            client_id = view.intent.client_user_message_id
            page = transcript_turns(path, message_uuid(client_id), client_id)
            for turn in page.turns:
                if turn.items:
                    echo = Echo(message_uuid(client_id), client_id, view.intent.id, turn.id, "transcript")
                    facts.append(self._echo_envelope(echo, source))
        return facts


def _inner(answer: dict[str, Any]) -> dict[str, Any]:
    """The CLI's own answer inside a control_response (any JSON value: an object counts)."""
    inner = answer.get("response")
    return inner if isinstance(inner, dict) else {}


def _count(listed: Any) -> Any:
    """How many ids an answer lists; a value that is no list, as the CLI wrote it."""
    return len(listed) if isinstance(listed, list) else listed


def _init_cwd(raw: bytes) -> str | None:
    cwd = cli_record(raw).get("cwd")
    return cwd if isinstance(cwd, str) else None


def _to_harness(raw: bytes) -> None:
    sys.stdout.buffer.write(raw)
    sys.stdout.buffer.flush()


def run_wrapper(recorder: Recorder, args: Sequence[str], *, retain_payloads: bool = False) -> int:
    """Run the CLI under the wrapper until it exits; its exit code (128 + N when signal N
    ended it, as a shell says)."""
    command = claude_command(args)
    wrapper = Wrapper(recorder, args, retain_payloads=retain_payloads)
    code = anyio.run(wrapper.run, command)
    return 128 - code if code < 0 else code
