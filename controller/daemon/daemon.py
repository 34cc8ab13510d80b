"""``tillerman run``: the daemon beside a Codex app-server.

One task group (anyio, structured): the **connection** (connect, initialize,
subscribe, follow; reconnect with backoff when the server goes away), the
**brain** (the only ledger writer of observations and decisions: it batches what
the connection saw, folds it, runs the rules and the policy, and hands each
decision to the intent's delivery machine), one **delivery** task per intent at a
time (``tillerman.controller.dispatch.driver`` carries the machine's commands through the
guarded adapter; a slow request never stalls the brain), the **file followers** (``--watch``: session files tailed
through ``tillerman.monitor.watch``; each batch carries the file offsets the brain records in
the same transaction as its events), and the **notifier** with its sinks. The connection
is optional: with ``--watch`` alone the daemon observes files only. SIGINT/SIGTERM cancel the group:
every append is one transaction, so nothing is half-written.

Before it dispatches anything after a start, the daemon folds the ledger and
reconciles every intent whose delivery is under way (``dispatch_unknown``,
``queued``): a restart never resends, it reads back. What to read back and what it
shows is planned by ``tillerman.controller.core.reconcile``; the daemon only asks the server.

Several daemons on one PostgreSQL ledger share the threads by lease
(``tillerman.controller.dispatch.leases_keeper``): each decides and dispatches only for the threads
it holds, takes a thread whose lease is free or expired after reading it back and
reconciling its deliveries under way, and fences every dispatch with the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import msgspec
from anyio.abc import TaskStatus

from tillerman.controller.claude.hook_delivery import Outboxes, is_hook_thread, settle
from tillerman.controller.core.delivery import READBACK_PAGE, Delivery
from tillerman.controller.core.facts import Dispatch, VerifyDue
from tillerman.controller.core.intent_requests import intent_view
from tillerman.controller.core.reconcile import (
    read_back,
    reconcile_fact,
    seen,
    turn_items,
    turns_to_read_back,
    under_way,
    verify_due,
)
from tillerman.controller.core.round import Carry, Round
from tillerman.controller.core.stop import machine_from_view
from tillerman.controller.core.supervisor import Step
from tillerman.controller.core.watches import Watches
from tillerman.controller.daemon.collector import Collector
from tillerman.controller.daemon.ledger_gate import GatedRecorder
from tillerman.controller.daemon.ledger_health import LedgerHealth
from tillerman.controller.daemon.link import HEARTBEAT, Link
from tillerman.controller.daemon.metrics import Metrics, TimedRecorder
from tillerman.controller.daemon.reload import POLL_EVERY, RuleReloader
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.controller.dispatch.driver import StaleDelivery, carry_out, kill_at
from tillerman.controller.dispatch.leases_keeper import LeaseKeeper
from tillerman.controller.dispatch.turn_listing import settled_listing, starting
from tillerman.controller.notify.notices import Notifier
from tillerman.controller.notify.sinks import SinkRunner
from tillerman.controller.notify.usage_report import UsageReport
from tillerman.controller.review.checkpoints import Checkpoints, Job, ask_at, is_reviewer_thread
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.changes import ChangeFeed
from tillerman.ledger.command_patterns import DEFAULT as DEFAULT_PATTERNS
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.ledger.errors import Fenced, IllegalTransition, OperationalError
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.recorder import Recorder
from tillerman.monitor import codex_wire as wire
from tillerman.monitor.appserver_client import (
    AppServerClient,
    AppServerDisconnected,
    JsonlTrace,
    backoff_delays,
    open_app_server,
)
from tillerman.monitor.appserver_events import decode_hot
from tillerman.monitor.appserver_info import describe_failure
from tillerman.monitor.appserver_tap import AppServerTap, resume_wakes_nothing
from tillerman.monitor.codex_home import OWN_CLIENT_NAME
from tillerman.monitor.jsonrpc import RpcError
from tillerman.monitor.redact import redact_message
from tillerman.monitor.tailer import FileBatch, Tailer
from tillerman.monitor.watch import Watch
from tillerman.rules.config import Effective, patterns_digest
from tillerman.rules.decision import DISPATCH_ACTIONS, Action, Decision
from tillerman.rules.notify import NotifySink
from tillerman.rules.review import Reviewer
from tillerman.rules.ruleset import RuleSet

log = logging.getLogger("tillerman")

RETRY_AFTER = 0.1  # seconds before a round that lost a race to another writer is decided again
POLL_INTERVAL = 1.0  # the brain's longest sleep: a safety net under the ledger watcher
BATCH = 512  # observations appended per transaction at most
HEARTBEAT_EVERY = 5.0  # seconds; the fold snapshot is saved with it when the fold moved
RECONNECT_MAX = 5.0  # seconds: the longest wait between two attempts to reach the server
LEDGER_RETRY = 1.0  # seconds between two tries of a round the ledger refused
ON_OVERDUE_TIMEOUT = 30.0  # seconds an --on-overdue command may take per notice


@dataclass(frozen=True)
class DaemonOptions:
    url: str | None = None  # None: no app-server, files only (--watch)
    client_name: str = OWN_CLIENT_NAME
    default_socket: bool = False  # Codex's own shared server (tillerman.monitor.codex_home)
    trace: str | None = None
    retain_payloads: bool = False
    dry_run: bool = False
    on_overdue: str | None = None
    request_timeout: float = 10.0
    watch: tuple[str, ...] = ()  # directories whose session files are followed (tillerman.monitor.watch)
    rules_path: str | None = None  # watched: a valid change is applied, an invalid one recorded and refused
    config_path: str | None = None  # --config as given; None: the default file, watched even while absent
    patterns: CommandPatterns = DEFAULT_PATTERNS
    reviewers: tuple[Reviewer, ...] = ()  # [[reviewer]]: asked at the checkpoints of rules with `review`
    sinks: tuple[NotifySink, ...] = ()  # the config file's [[notify]] tables
    metrics: Metrics | None = None  # --metrics: counted, and served by the caller
    lease: float | None = None  # --lease: threads shared by lease with other daemons on a database ledger
    usage_report: UsageReport | None = None  # the built-in usage notices; None: [defaults] usage_report = false
    dashboard_url: str | None = None  # [dashboard] url: each notice links to its thread's page there

    def notify_sinks(self) -> tuple[NotifySink, ...]:
        """The [[notify]] sinks, and ``--on-overdue`` as one more: overdue notices only,
        each at once and on its own (no grouping), a shell command line as it always took."""
        if self.on_overdue is None:
            return self.sinks
        return (*self.sinks, NotifySink(name="on-overdue", shell=self.on_overdue, group_window=0.0,
                                        kinds=("overdue",), timeout=ON_OVERDUE_TIMEOUT, per_notice=True))


class Daemon:
    def __init__(self, recorder: Recorder, ruleset: RuleSet, options: DaemonOptions,
                 *, clock: Callable[[], float] = time.time) -> None:
        self.metrics = options.metrics
        # Gated: a round's commit runs on a worker thread, and any other use waits for it.
        self.recorder = GatedRecorder(recorder if self.metrics is None else TimedRecorder(recorder, self.metrics))
        self.options = options
        self.clock = clock
        self.step = Step(ruleset, replay=False)
        self.tap = AppServerTap(options.url, patterns=options.patterns, retain_payloads=options.retain_payloads)
        self.adapter: GuardedAdapter | None = None
        self.tailer: Tailer | None = None  # set when --watch follows files
        self.watcher: Watch | None = None  # with them: which --watch directories are not there yet
        self.machines: dict[str, Delivery] = {}
        self._verifying: set[str] = set()  # intents whose readback this run already asked for
        self._saved_seq = -1  # the seq of the last saved fold snapshot
        self._locks: dict[str, anyio.Lock] = {}
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[list[Envelope] | FileBatch](64)
        self._due: float | None = None
        # Threads with folded entries no decision round has judged yet. Every fold adds to
        # it, not only a round's first: a proposal another process commits while a round
        # writes is folded by that round's later folds, after its threads were chosen, and
        # once folded no "ledger changed" probe sees it again.
        self._unjudged: set[str] = set()
        self._beat_now = False  # the connection changed: write the heartbeat at the next round
        self._fold_ahead = False  # a round failed after folding rows it did not write
        sinks = options.notify_sinks()
        self.notifier = Notifier(sinks, options.usage_report, options.dashboard_url)
        self.sink_runner = SinkRunner(sinks, self.recorder, clock=clock, wake=self.wake)
        self.checkpoints = Checkpoints(options.reviewers)  # fed by the round's fold; reviews run as tasks
        # The decision round replay drives too (``tillerman.controller.core.round``): the
        # daemon adds the ledger, the clock, the connection and the delivery tasks.
        self.round = Round(Projection(), self.step, self._append_own, reviews=self.checkpoints,
                           followers=(self._took_in,), delivering=self._delivering)
        # Claude Code sessions seen through their hooks: what each session's hook may deliver.
        self.outboxes = Outboxes(options.watch, self.recorder.path)
        self.connected = anyio.Event()
        self.link = Link(options.url, options.client_name, options.default_socket, since=clock())
        self.started_at = clock()
        self.collector = Collector(self.started_at)
        leases = self.recorder.leases() if options.lease else None  # through the gate, as every other use
        self.keeper = LeaseKeeper(leases, options.lease) if leases is not None else None
        self._client: AppServerClient | None = None  # the live connection, for a takeover's readback
        self.health = LedgerHealth()  # an outage of the ledger said once, and shown by `status`

    @property
    def projection(self) -> Projection:
        return self.round.projection

    @projection.setter
    def projection(self, projection: Projection) -> None:
        self.round.projection = projection  # the watches follow it at the next fold

    @property
    def watches(self) -> Watches:
        return self.round.watches

    # -- the task group ---------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        """Everything that needs no app-server starts at once: a daemon whose server is
        not up yet still follows files, beats, decides and reports what is overdue. The
        connection comes and goes on its own; nothing is sent before it has read back
        what was under way (``_connection``)."""
        self.projection = projections.load(self.recorder)
        if self.checkpoints.reviewers:  # what was asked and answered before: once, at the start
            for entry in self.recorder.read(limit=self.projection.seq):
                self.checkpoints.note(entry)
        self.notifier.load(self.recorder)  # what was notified: read back, never assumed
        self.collector.start(self.clock())
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._signals, tg.cancel_scope)
            self._catch_up(tg, self.clock())
            self.notifier.drop_settled(self.projection)
            if self.metrics is not None:
                self.metrics.start(self.projection)
            self._due = self.clock()  # decide every open intent once: no new entry may touch them
            tg.start_soon(self._brain, tg)
            if (feed := self.recorder.change_feed()) is not None:
                tg.start_soon(self._follow_ledger, feed)
            if self.options.watch:
                tg.start_soon(self._follow_files)
            tg.start_soon(self.sink_runner.run)
            tg.start_soon(self._watch_rules)
            if self.keeper is not None:
                tg.start_soon(self._keep_leases, tg)
            if self.options.url:
                tg.start_soon(self._connection, tg)
            task_status.started()

    async def _follow_ledger(self, feed: ChangeFeed) -> None:
        """Wake the brain on every commit to the ledger by any process (another process
        proposing an intent), as the ledger's change feed tells of it. A feed that can no
        longer tell (a database connection lost: the server restarted, failed over, or
        dropped it) is followed anew, with backoff; the brain is woken then, for what was
        committed meanwhile unheard."""
        while True:
            try:
                async for _ in feed:
                    self.wake()
                return
            except OperationalError as exc:
                self._ledger_failed(exc)
            finally:
                feed.close()
            feed = await self._feed_again()
            self.wake()

    async def _feed_again(self) -> ChangeFeed:
        """A new change feed, tried with backoff until the database answers."""
        delays = backoff_delays(maximum=RECONNECT_MAX)
        while True:
            await anyio.sleep(next(delays))
            try:
                return await anyio.to_thread.run_sync(self.recorder.change_feed)
            except OperationalError as exc:
                self._ledger_failed(exc)

    def _ledger_failed(self, exc: OperationalError) -> None:
        """Said once per outage, whichever task meets it first; every task retries on its own."""
        if self.health.failed(str(exc), self.clock()):
            log.error("ledger not writable (%s): holding observations and every dispatch until it is;"
                      " retrying", exc)
            self._beat_now = True  # the heartbeat after it shows the outage
        else:
            log.info("ledger still not writable (%s); retrying", exc)

    def _ledger_answered(self) -> None:
        """The brain's round went through: an outage it ends is said, once."""
        if (outage := self.health.recovered(self.clock())) is not None:
            log.warning("ledger reachable again after %.1fs: held observations are recorded, decisions resume",
                        outage.until - outage.since)
            self._beat_now = True

    def wake(self) -> None:
        """Ask the brain to look at the ledger now."""
        with contextlib.suppress(anyio.WouldBlock):
            self._inbox_send.send_nowait([])

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
            async for signum in received:
                log.info("received %s: stopping", signal.Signals(signum).name)
                scope.cancel()
                return

    async def _watch_rules(self, poll_every: float = POLL_EVERY) -> None:
        """Record the rule set at start; reload the rule and config files when they
        change (polled) or on SIGHUP (see ``tillerman.controller.daemon.reload``)."""
        reloader = RuleReloader(self.options.rules_path, self.options.config_path, Effective(
            ruleset=self.step.ruleset, patterns=self.options.patterns,
            patterns_digest=patterns_digest(self.options.patterns)))
        forced, pending, swap = False, [], None
        with anyio.open_signal_receiver(signal.SIGHUP) as hup:
            while True:
                outcome = reloader.poll(self.clock(), forced=forced)
                pending.extend(outcome.envelopes)
                swap = outcome.effective or swap
                try:
                    self._write(pending)
                    pending = []
                except OperationalError as exc:  # no new rules decide before the change is on record
                    log.error("ledger not writable (%s): rule set change held until it is recorded", exc)
                if swap is not None and not pending:  # same loop as the brain: no step sees half a swap
                    self.step.ruleset = swap.ruleset
                    self.checkpoints.reviewers = {r.name: r for r in swap.reviewers}
                    if self.adapter is not None:
                        self.adapter.ruleset = swap.ruleset
                    self.tap.use_patterns(swap.patterns)
                    if self.tailer is not None:
                        self.tailer.use_patterns(swap.patterns)
                    self._due = self.clock()  # re-evaluate every thread under the new rules
                    swap = None
                forced = False
                with anyio.move_on_after(poll_every):
                    async for _ in hup:
                        forced = True
                        break

    # -- the connection ---------------------------------------------------------------

    async def _connection(self, tg) -> None:
        """Connect, subscribe to every loaded thread, follow; reconnect with backoff when
        the server goes away or is not there yet. Facts seen twice (a reconnect, a resume)
        keep their natural-key ids. The adapter exists only while a connection does, and
        only after every delivery under way has been read back: a dead connection is
        never written to, and a restart never sends before it knows what happened."""
        # One trace for the daemon's life: a delivery still holding the lost connection's
        # adapter must get "disconnected" from it, not a write to a closed trace file.
        trace = None
        if self.options.trace:
            trace = JsonlTrace(self.options.trace, redact=None if self.options.retain_payloads else redact_message)
        delays = backoff_delays(maximum=RECONNECT_MAX)
        while True:
            try:
                async with open_app_server(self.options.url, client_name=self.options.client_name, trace=trace,
                                           connect_timeout=self.options.request_timeout, retry=False,
                                           fast=decode_hot) as client:
                    await self._attach(tg, client)
                    delays = backoff_delays(maximum=RECONNECT_MAX)
                    await self._follow(tg, client)
                    reason, absent = "the server closed the connection", False
            except (OSError, AppServerDisconnected, RpcError, TimeoutError) as exc:
                reason = describe_failure(exc, self.link.server_version)
                absent = isinstance(exc, FileNotFoundError | ConnectionRefusedError)
            self.adapter, self._client = None, None
            self.connected = anyio.Event()
            delay = next(delays)
            if reason != self.link.error:  # one line per outage, not one per retry
                log.warning("%s", self.link.failed(reason, self.clock(), nothing_listens=absent))
                self._beat_now = True
            else:
                log.info("still cannot reach %s (%s); retrying in %.1fs", self.options.url, reason, delay)
            await anyio.sleep(delay)

    async def _follow(self, tg, client: AppServerClient) -> None:
        """Pass what the server sends through the tap to the brain, one list per wake-up:
        every message already waiting (up to ``BATCH``) goes in one send. A send lets the
        brain run, and nothing is read while a round runs, so a send per message made a
        round per message however long the backlog; this way rounds grow with it."""
        async for message in client.incoming:
            envelopes = self._tap(tg, client, message)
            for _ in range(BATCH - 1):
                try:
                    message = client.incoming.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
                envelopes += self._tap(tg, client, message)
            await self._send_envelopes(envelopes)

    def _tap(self, tg, client: AppServerClient, message) -> list[Envelope]:
        out = self.tap.receive(message, self.clock())
        for thread_id in out.resume:
            tg.start_soon(self._resume, client, thread_id, True)  # its `active` status just came
        for thread_id, turn_id in self.tap.account_usage_wanted(out.envelopes):
            if self.projection.snapshot(thread_id).supervised:
                tg.start_soon(self._read_account_usage, client, thread_id, turn_id)
        return list(out.envelopes)

    async def _read_account_usage(self, client: AppServerClient, thread_id: str, turn_id: str) -> None:
        """The server's own estimate of a thread's cost at the end of a turn
        (``account/usage/read``), recorded beside ours. A server that refuses it (an older
        one without the method, or one with no account signed in, as offline) is asked no
        more on this connection: one refusal, not one per turn."""
        if self.tap.account_usage_refused is not None:
            return  # refused while this read waited to start
        try:
            result = await client.request(*wire.account_usage_read(thread_id), timeout=self.options.request_timeout)
        except RpcError as exc:
            if self.tap.account_usage_refused is None:
                log.info("the server does not report account usage (%s); not asked again on this connection", exc)
            self.tap.account_usage_refused = str(exc)
            return
        except (TimeoutError, AppServerDisconnected) as exc:
            log.info("cannot read the account usage of thread %s (%s)", thread_id, exc)
            return
        if isinstance(result, dict):
            await self._send_envelopes(self.tap.account_usage(result, turn_id, self.clock()))

    async def _attach(self, tg, client: AppServerClient) -> None:
        """A fresh connection: subscribe, read back, then let deliveries through."""
        self.tap.connected()
        self.link.up(client.initialize_result, self.clock())
        loaded = await client.request("thread/loaded/list", {}, timeout=self.options.request_timeout)
        for thread_id in self.tap.loaded([t for t in loaded.get("data", []) if isinstance(t, str)]):
            await self._resume(client, thread_id)
        await self._reconcile_under_way(tg, client)
        self.adapter = GuardedAdapter(client, self.recorder, self.step.ruleset, snapshot=self.projection.snapshot,
                                      recorded_cwd=self.projection.recorded_cwd,
                                      timeout=self.options.request_timeout, clock=self.clock,
                                      retain_payloads=self.options.retain_payloads)
        self._client = client
        self.connected.set()
        self._beat_now = True  # `status` shows the connection now, not at the next beat
        self.wake()
        log.info("attached to %s as %s", self.options.url, self.options.client_name)

    async def _follow_files(self) -> None:
        """Follow the session files under ``--watch`` (observe-only: file threads are not
        steerable). Each batch goes through the brain like the connection's."""
        known = self.recorder.file_offsets()
        self.tailer = Tailer(known=known, patterns=self.options.patterns, retain_payloads=self.options.retain_payloads)
        self.watcher = Watch(self.options.watch, self.tailer, self._inbox_send.send)
        await self.watcher.run()

    async def _resume(self, client, thread_id: str, running: bool = False) -> None:
        """Subscribe to a thread, unless that would start work: ``running`` when its
        ``active`` status just came, else its status is read first (an idle thread is left
        unsubscribed until its next turn: ``resume_wakes_nothing``)."""
        # What a read of a thread that started before we attached says it is goes to the
        # brain with what the resume reveals, in one list: sent alone, the brain judged a
        # thread it knew without the turn running in it, and dispatched a queued message
        # as if to an idle thread (waiting behind no turn, so never settled by a readback).
        envelopes: list[Envelope] = []
        unknown = self.tap.users_work(thread_id) is None and not self.projection.snapshot(thread_id).known
        if unknown or not running:
            read = await self._read_thread(client, thread_id)
            envelopes = self.tap.read(read) if unknown and read is not None else []
            running = resume_wakes_nothing(wire.parse_thread_status(read))
        if self.tap.users_work(thread_id) is False or not self.projection.snapshot(thread_id).supervised:
            await self._send_envelopes(envelopes)  # Codex's own housekeeping: recorded, never subscribed to
            return
        if not running:
            await self._send_envelopes(envelopes + await self._idle_thread_seen(client, thread_id))
            return
        try:
            result = await client.request(*wire.thread_resume(thread_id), timeout=self.options.request_timeout)
        except (RpcError, TimeoutError, AppServerDisconnected) as exc:
            log.info("cannot subscribe to thread %s yet (%s)", thread_id, exc)
            self.tap.subscribe_when_active(thread_id)
            await self._send_envelopes(envelopes)
            return
        # A turn the ledger already holds (seen live, or before this reconnect or restart)
        # is not offered again: the resume's copy is stamped with the time of the resume,
        # so the ledger stored it as a conflict at every reconnect mid-turn
        # (tests/live/test_daemon_live.py, reconnect case).
        known = self.projection.threads.get(thread_id)
        envelopes += [e for e in self.tap.resumed(result, self.clock())
                      if known is None or known.turn_state(e.event.turn_id) is None]
        page = result.get("initialTurnsPage") if isinstance(result, dict) else None
        # The thread runs a turn (it is resumed only then), so its newest turn listed
        # undecided is that turn starting, not one that ended.
        listed = wire.parse_turn_page(page).turns
        envelopes += seen(self.projection, thread_id, listed[1:] if starting(listed) else listed, self.tap.source)
        await self._send_envelopes(envelopes)

    async def _send_envelopes(self, envelopes: list[Envelope]) -> None:
        if envelopes:
            await self._inbox_send.send(envelopes)

    async def _idle_thread_seen(self, client, thread_id: str) -> list[Envelope]:
        """An idle thread is subscribed to at its next ``active`` status, not now (a resume
        would start its goal's work). What a resume would have shown is read instead: its
        latest turn (one that ended while this daemon was away) and its goal."""
        self.tap.subscribe_when_active(thread_id)
        turns = await self._list_turns(client, thread_id, limit=1)
        envelopes = seen(self.projection, thread_id, turns or (), self.tap.source)
        try:
            goal = await client.request(*wire.goal_get(thread_id), timeout=self.options.request_timeout)
        except (RpcError, TimeoutError, AppServerDisconnected) as exc:  # e.g. "goals feature is disabled"
            log.info("cannot read the goal of thread %s (%s)", thread_id, exc)
            return envelopes
        return envelopes + (self.tap.goal(goal, self.clock()) if isinstance(goal, dict) else [])

    async def _read_thread(self, client, thread_id: str) -> dict | None:
        """``thread/read``: what a thread is (the user's work, or Codex's housekeeping) and
        whether a turn runs in it; None when it cannot be read."""
        try:
            result = await client.request(*wire.thread_read(thread_id), timeout=self.options.request_timeout)
        except (RpcError, TimeoutError, AppServerDisconnected) as exc:
            log.info("cannot read thread %s (%s)", thread_id, exc)
            return None
        return result if isinstance(result, dict) else None

    # -- the brain --------------------------------------------------------------------

    async def _brain(self, tg) -> None:
        pending: list[Envelope] = []
        offsets: list[FileOffset] = []  # file positions, recorded with the events they cover
        last_beat = 0.0
        anchor_error: str | None = None

        def take(item: list[Envelope] | FileBatch) -> None:
            if isinstance(item, FileBatch):
                pending.extend(item.envelopes)
                offsets.extend(item.offsets)
            else:
                pending.extend(item)

        while True:
            wait = POLL_INTERVAL if self._due is None else min(POLL_INTERVAL, max(0.0, self._due - self.clock()))
            if self._unjudged:
                wait = 0.0  # a round folded what it did not judge: the next round judges it now
            with anyio.move_on_after(wait):
                take(await self._inbox.receive())
            while len(pending) < BATCH:  # take whatever else is already waiting
                try:
                    take(self._inbox.receive_nowait())
                except anyio.WouldBlock:
                    break
            try:
                if pending or offsets or self._unjudged or self._ledger_changed() or self._timer_due():
                    await self._think(tg, pending, offsets)
                pending = []
                offsets = []
                self._ledger_answered()
                if self.recorder.anchor_error != anchor_error:  # said once, and once more when healed
                    anchor_error = self.recorder.anchor_error
                    log.warning("%s", f"committed, but {anchor_error}" if anchor_error else "head anchor caught up")
                if self._beat_now or self.clock() - last_beat >= HEARTBEAT_EVERY:
                    self._beat_now, last_beat = False, self.clock()
                    self._heartbeat(last_beat)
            except OperationalError as exc:
                # Never act without a record: hold the observations and every decision
                # until the ledger takes writes again (the inbox fills, and then the
                # connection and the file followers wait for the brain). Tried again each
                # second, not backing off: a held steer has only its turn to land in, and
                # a try costs one statement (the connections themselves back off).
                self._ledger_failed(exc)
                await anyio.sleep(LEDGER_RETRY)

    def _ledger_changed(self) -> bool:
        """Whether the ledger gained rows the fold has not seen (another process's
        intent, or this daemon's delivery tasks): one indexed lookup, so an idle daemon
        stays near zero CPU. (Inside a round the fold runs ahead of the table: its own
        rows are written when the round ends.)"""
        return self.recorder.max_seq() > self.projection.seq

    def _timer_due(self) -> bool:
        return self._due is not None and self.clock() >= self._due

    def _heartbeat(self, now: float) -> None:
        beat = {"pid": os.getpid(), "since": self.started_at, "heartbeat": now, "watch": list(self.options.watch),
                "watch_waiting": self.watcher.waiting if self.watcher else [],
                "codex": self.link.as_dict() if self.options.url else None,
                "ledger_outage": self.health.last.as_dict() if self.health.last else None}
        self.recorder.save_snapshot(HEARTBEAT, self.projection.seq, msgspec.json.encode(beat))
        if self.projection.seq != self._saved_seq:
            projections.save(self.recorder, self.projection)
            self.notifier.save(self.recorder)
            self._saved_seq = self.projection.seq
        self.collector.settle(now)

    async def _think(self, tg, batch: list[Envelope], offsets: list[FileOffset] | None = None) -> None:
        """One round in one transaction (``Recorder.bulk``): the observations, and the
        decisions they cause, commit together, so a decision waits for no commit of its
        observations. The round runs on the loop; its commit (and the head anchor's one
        move, ``one_anchor``) on a worker thread, while the loop reads on: the rest of the
        daemon waits for it at the ledger's gate (``tillerman.controller.daemon.ledger_gate``).
        Nothing the round decided starts before that commit (the round queues it: ``Round.take``):
        never act without a record. A round that fails has folded rows that were not written:
        the fold is read again from the ledger before the next one."""
        if self._fold_ahead:
            self.projection = projections.load(self.recorder)
            self._fold_ahead = False
        async with self.recorder.turns:  # never beside a delivery's write on the commit thread
            await self._round_and_commit(tg, batch, offsets)

    async def _round_and_commit(self, tg, batch: list[Envelope], offsets: list[FileOffset] | None) -> None:
        try:
            with contextlib.ExitStack() as transaction:
                transaction.enter_context(self.recorder.one_anchor())  # a round's commits move it once
                transaction.enter_context(self.recorder.bulk())
                self._round(tg, batch, offsets)
                ending = transaction.pop_all()
            # What other tasks drive while the commit is out starts at once: their writes
            # wait at the gate. What this round drives waits for its commit.
            held = self.round.take()
            committed = asyncio.wrap_future(self.recorder.commit_off_loop(ending.close))
            with anyio.CancelScope(shield=True):  # a stop waits for the commit: nothing half-written
                await committed
        except BaseException:
            self.round.take()  # nothing of a round that did not commit is carried out
            self._fold_ahead = True
            self._due = self.clock()  # every thread judged again once the ledger takes writes
            raise
        self._carry(tg, held)

    def _round(self, tg, batch: list[Envelope], offsets: list[FileOffset] | None) -> None:
        now = self.clock()
        if batch or offsets:  # events and file positions together
            self.round.fold(self._after_gap(self.recorder.append(batch, offsets=offsets or ()).entries), now)
        if self._ledger_changed():
            self._refold(now)  # what other writers added before this round's transaction
        try:
            self._decide(tg, now)
        except IllegalTransition as exc:
            # Another writer (a person's `intent cancel`) moved an intent between our fold
            # and our write: the protocol's normal case. The ledger refused the whole batch,
            # so nothing of it was written; fold what won (its thread is judged again) and
            # decide again next round.
            log.info("an intent moved while this round decided (%s): deciding again", exc)
            self._refold(now)
            self._due = self.clock() + RETRY_AFTER  # soon, but never a busy loop

    def _decide(self, tg, now: float) -> None:
        """The round for the threads this daemon judges now: those folded since the last
        round, or every thread when a timer is due (``Round.decide``); then the hooks'
        outboxes, the reviews due (as tasks), the notices, and when the next round is due."""
        timer_due = self._due is not None and now >= self._due
        if not self._unjudged and not timer_due:
            return
        threads = list(self.projection.threads) if timer_due else sorted(self._unjudged)
        self._unjudged.clear()  # what the folds below add is judged by the next round
        if self.keeper is not None:  # several daemons: only the threads this one holds, read back
            threads = [t for t in threads if self.keeper.ready(t)]
        if self.checkpoints.reviewers:  # a reviewer's own session is never supervised
            threads = [t for t in threads
                       if not is_reviewer_thread(self.projection.recorded_cwd(t), self.checkpoints.reviewers.values())]
        decided = self.round.decide(threads, now, every_intent=timer_due,
                                    ready=self.keeper.ready if self.keeper is not None else None,
                                    act=lambda decisions: self._act(decisions, now))
        self.outboxes.flush(self.projection)
        for job in decided.jobs:
            tg.start_soon(self._review, job)
        self.sink_runner.hand(self.notifier.due(self.projection, now))
        if self.metrics is not None:
            self.metrics.overdue.set(self.notifier.overdue_now)
        self._due = min((t for t in (self.round.next_due(now), self.notifier.next_due()) if t is not None),
                        default=None)

    def _write(self, envelopes: list[Envelope]) -> tuple[Entry, ...]:
        """Append; the rows written. A writer outside the brain (the rule watcher) leaves
        them to the brain's next read."""
        return self.recorder.append(envelopes).entries if envelopes else ()

    def _append_own(self, envelopes: list[Envelope]) -> list[Entry]:
        """The round's append: the rows it wrote, to fold without reading them back."""
        return self._after_gap(self._write(envelopes))

    def _after_gap(self, entries: tuple[Entry, ...]) -> list[Entry]:
        """Rows this brain just appended, and before them the rows of other writers (another
        process, this daemon's delivery tasks) committed since the last fold: a gap
        between the fold and our first seq, read first."""
        if not entries:
            return []
        missing = entries[0].seq - 1 - self.projection.seq
        gap = list(self.recorder.read(after_seq=self.projection.seq, limit=missing)) if missing > 0 else []
        return [*gap, *entries]

    def _refold(self, now: float) -> None:
        """Fold every row past the fold: what other writers added since (another process,
        the delivery tasks, the rule watcher), or what the ledger holds at a start. What
        it queues for the deliveries is carried out with the round it is part of."""
        self.round.fold(self.recorder.read(after_seq=self.projection.seq), now)

    def _catch_up(self, tg, now: float) -> None:
        """``_refold`` outside a round: what it queues for the deliveries starts at once."""
        self._refold(now)
        self._carry(tg, self.round.take())

    def _took_in(self, entry: Entry) -> None:
        """What the daemon keeps of each entry the round folds: the notices and metrics,
        and the threads the next round judges (``_unjudged``)."""
        self.notifier.fold(entry)
        if self.metrics is not None:
            self.metrics.fold(entry)
        event = entry.envelope.event
        if isinstance(event, ev.Undecodable):
            log.warning("ledger seq %d cannot be decoded and was skipped (%s: %s)",
                        entry.seq, event.stored_kind, event.error)
        if event.thread_id is not None:
            self._unjudged.add(event.thread_id)
        if isinstance(event, ev.IntentProposed):
            self._unjudged.add(event.intent.thread_id)

    def _delivering(self, thread_id: str) -> list[Intent]:
        """The intents whose deliveries under way on the thread wait for what is seen there."""
        return [m.intent for m in self.machines.values() if m.intent.thread_id == thread_id and not m.finished]

    # -- acting on decisions ----------------------------------------------------------

    def _act(self, decisions: list[tuple[IntentView, Decision]], now: float) -> None:
        """What the round's decisions lead to, inside the round: a fact for each delivery,
        queued with the round's own (``Round.carry``) and started after its commit."""
        for view, decision in decisions:
            if is_hook_thread(self.projection.snapshot(view.intent.thread_id)):
                self._act_through_hooks(view, decision, now)
            elif (fact := self._fact(view, decision, now)) is not None:
                self.round.carry(view.intent.id, fact)

    def _fact(self, view: IntentView, decision: Decision, now: float) -> object | None:
        """The fact one decision is for its intent's delivery machine, or None."""
        intent_id = view.intent.id
        if decision.action in DISPATCH_ACTIONS:
            if self.options.dry_run or view.state != State.PROPOSED:
                return None
            if not self.checkpoints.may_dispatch(view, self.step.ruleset):
                return None  # held until its review answers ready_for_existing_gate (a task asks it)
            snapshot = self.projection.snapshot(view.intent.thread_id)
            return Dispatch(now, uuid.uuid4().hex, snapshot.active_turn_id, snapshot.active_turn_started_at)
        if decision.action is Action.RECONCILE:
            # A fresh token: a steer that follows the active turn may send again with it.
            return reconcile_fact(self.projection, view, now, None if self.options.dry_run else uuid.uuid4().hex)
        if decision.action is Action.VERIFY_EFFECT and intent_id not in self._verifying:
            # The machine asks for the readback itself when it sees the turn end; this
            # covers a restart after the end.
            if verify_due(self.projection, view):
                self._verifying.add(intent_id)
                return VerifyDue(now)
        return None

    def _act_through_hooks(self, view: IntentView, decision: Decision, now: float) -> None:
        """A session reached through Claude Code's hooks: a dispatch puts the intent in its
        outbox for the hook to claim (``tillerman.controller.claude.hook_delivery``); a delivery
        under way settles from the spool's evidence. Nothing goes to an app-server."""
        if decision.action in DISPATCH_ACTIONS and view.state == State.PROPOSED and not self.options.dry_run \
                and self.checkpoints.may_dispatch(view, self.step.ruleset):
            self.outboxes.want(view)
            return
        self.outboxes.drop(view)
        if decision.action is Action.RECONCILE:
            self.round.record(settle(self.projection, view, now), now)

    async def _reconcile_under_way(self, tg, client: AppServerClient) -> None:
        """Every intent whose delivery is under way is read back before anything new is
        sent (after a start, or a reconnect)."""
        self._catch_up(tg, self.clock())
        await self._read_back_turns(tg, client)
        for view in under_way(self.projection):
            if self.keeper is None or self.keeper.holds(view.intent.thread_id):
                self._drive(tg, view.intent.id, reconcile_fact(self.projection, view, self.clock()))
        # Then every open intent is decided once more: after a start the ledger already holds
        # intents no new entry will touch, and a decision made while disconnected was dropped.
        self._due = self.clock()

    async def _read_back_turns(self, tg, client: AppServerClient, only: set[str] | None = None) -> None:
        """What happened while this daemon was away (dead, or disconnected): the turns of
        the threads ``turns_to_read_back`` names are listed, and what they show is recorded
        (``tillerman.controller.core.reconcile``). The fold then settles (or dispatches) the
        intent as the live notifications would have. ``only``: these threads (a takeover);
        else every thread, or with leases every thread this daemon holds."""
        envelopes: list[Envelope] = []
        for thread_id, turn_ids in turns_to_read_back(self.projection).items():
            if (only is not None and thread_id not in only) or (
                    only is None and self.keeper is not None and not self.keeper.holds(thread_id)):
                continue
            turns = await self._list_turns(client, thread_id)
            if turns is not None:
                envelopes += read_back(self.projection, thread_id, turns, turn_ids, self.tap.source)
        if envelopes:
            try:
                self._write(envelopes)
                self._due = self.clock()  # the brain re-decides every thread with what was read back
            except OperationalError as exc:
                log.error("ledger not writable (%s): turns that ended meanwhile not recorded yet", exc)
        self._catch_up(tg, self.clock())

    async def _list_turns(self, client: AppServerClient, thread_id: str,
                          limit: int = READBACK_PAGE) -> tuple[wire.Turn, ...] | None:
        """The thread's latest turns (``thread/turns/list``), or None when the server did
        not answer."""
        try:
            page = await settled_listing(lambda: client.request(*wire.turns_list(thread_id, limit),
                                                                timeout=self.options.request_timeout))
        except (RpcError, TimeoutError, AppServerDisconnected) as exc:
            log.info("cannot read back the turns of thread %s (%s)", thread_id, exc)
            return None
        listed = wire.parse_turn_page(page)
        if not listed.readable:
            log.info("the turns of thread %s came back without a list: nothing concluded from them", thread_id)
            return None
        return listed.turns

    async def _review(self, job: Job) -> None:
        """One checkpoint, off the decision path; the brain folds its records and acts on them."""
        try:
            await ask_at(self.recorder, job, clock=self.clock, retain_payloads=self.options.retain_payloads)
        except OperationalError as exc:  # not recorded: asked again once the ledger takes writes
            log.error("review %s: ledger not writable (%s); the intent stays held", job.packet.checkpoint_id, exc)
            self.checkpoints.done(job)
        self.wake()

    def _drive(self, tg, intent_id: str, fact) -> None:
        view = self.projection.intents.get(intent_id)
        thread = self.projection.threads.get(view.intent.thread_id) if view else None
        if thread is not None and thread.wrapped:
            return  # `tillerman claude` carries out this session's intents (it claims what we decided)
        if self.keeper is not None and view is not None and not self.keeper.holds(view.intent.thread_id):
            return  # another daemon's thread (or ours no longer): its owner carries it out
        tg.start_soon(self._carry_out, intent_id, fact)

    def _carry(self, tg, facts: list[Carry]) -> None:
        for intent_id, fact in facts:
            self._drive(tg, intent_id, fact)

    async def _carry_out(self, intent_id: str, fact) -> None:
        """One fact for one intent, in order: a lock per intent serializes its facts."""
        lock = self._locks.setdefault(intent_id, anyio.Lock())
        async with lock:
            if self.adapter is None:
                return
            machine = self.machines.get(intent_id) or self._machine(intent_id)
            fence = None
            if self.keeper is not None and (fence := self.keeper.fence(machine.intent.thread_id)) is None:
                self.machines.pop(intent_id, None)  # the lease went while this fact waited
                return
            try:
                await carry_out(machine, fact, self.recorder, self.adapter, kill_at, fence=fence)
            except Fenced as exc:
                # Our lease lapsed (we were paused, partitioned or slow) and maybe another
                # daemon owns the thread now: nothing was sent. Its owner reconciles the
                # intent by readback; should we take the thread again, so do we, first.
                log.warning("fenced: %s", exc)
                self._forget(machine.intent.thread_id)
            except (IllegalTransition, StaleDelivery) as exc:
                log.info("intent %s moved elsewhere (%s): rebuilding its machine from the ledger", intent_id, exc)
                self.machines[intent_id] = self._machine(intent_id)
            except OperationalError as exc:
                # The record could not be written, so nothing was sent; the machine may
                # have moved ahead of the ledger: rebuild it from the ledger next time.
                log.error("intent %s: ledger not writable (%s); nothing sent", intent_id, exc)
                self.machines.pop(intent_id, None)
            self.wake()  # fold what it recorded now, whatever the ledger watcher sees
            if machine.finished:
                self.machines.pop(intent_id, None)

    # -- several daemons: thread leases ------------------------------------------------

    async def _keep_leases(self, tg) -> None:
        """Renew this daemon's leases, take every thread it sees whose lease is free or
        expired, and read each taken thread back before deciding for it
        (``tillerman.controller.dispatch.leases_keeper``). A clean stop gives them all up."""
        keeper = self.keeper
        try:
            while True:
                healthy = self.options.url is None or self._client is not None
                try:
                    tick = keeper.tick(self._lease_candidates() if healthy else (), healthy=healthy)
                except OperationalError as exc:  # not renewed: they lapse, and the fence holds
                    self._ledger_failed(exc)
                    for thread_id in keeper.lapsed():  # surely gone by now: decide nothing for them
                        log.warning("lost the lease on thread %s: not renewed within the lease while the ledger"
                                    " was unreachable", thread_id)
                        self._forget(thread_id)
                else:
                    for thread_id in tick.lost:
                        log.warning("lost the lease on thread %s: another daemon may take it", thread_id)
                        self._forget(thread_id)
                    if tick.gained:
                        await self._take_over(tg, tick.gained)
                await anyio.sleep(keeper.renew_every)
        finally:
            with contextlib.suppress(OperationalError):
                keeper.leave()

    def _lease_candidates(self) -> list[str]:
        """The threads this daemon sees: those its connection follows, and with ``--watch``
        those followed through files (never steered)."""
        seen = set(self.tap.following())
        if self.options.watch:
            seen.update(t for t in self.projection.threads
                        if self.projection.snapshot(t).supervised and not self.projection.snapshot(t).steerable)
        return sorted(seen)

    async def _take_over(self, tg, threads: list[str]) -> None:
        """Threads just taken (new tokens): their turns are read back and every delivery
        under way reconciled, as after a restart, before any decision for them — the
        previous owner may have died or been paused mid-dispatch."""
        log.info("took the lease on thread(s) %s: reading back before deciding", ", ".join(threads))
        taken = set(threads)
        if self._client is not None:
            await self._read_back_turns(tg, self._client, only=taken)
        else:
            self._catch_up(tg, self.clock())
        for view in under_way(self.projection):
            if view.intent.thread_id in taken and self.keeper.holds(view.intent.thread_id):
                self.machines.pop(view.intent.id, None)  # rebuilt from the ledger: another daemon moved it
                self._drive(tg, view.intent.id, reconcile_fact(self.projection, view, self.clock()))
        self.keeper.reconciled(threads)
        self._unjudged.update(taken)
        self.wake()

    def _forget(self, thread_id: str) -> None:
        """The lease on ``thread_id`` is gone: drop its deliveries' machines (a later owner,
        this daemon included, rebuilds them from the ledger after its readback)."""
        self.keeper.lost(thread_id)
        for intent_id, machine in list(self.machines.items()):
            if machine.intent.thread_id == thread_id:
                del self.machines[intent_id]

    def _machine(self, intent_id: str) -> Delivery:
        view = intent_view(self.recorder, intent_id)
        machine = machine_from_view(view, turn_items=turn_items(self.projection, view))
        self.machines[intent_id] = machine
        return machine


def run_daemon(recorder: Recorder, ledger_path: str | None, ruleset: RuleSet, options: DaemonOptions) -> None:
    """Own the ledger (one daemon per ledger) and run until a signal stops it."""
    lock = LedgerLock(ledger_path) if ledger_path else None
    if lock:
        lock.acquire()
    recorder.checkpoint_in_background()  # no round's commit waits for a checkpoint
    try:
        anyio.run(Daemon(recorder, ruleset, options).run)
    finally:
        if lock:
            lock.release()
