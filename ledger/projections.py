"""Folds: the state of threads, turns, tools, approvals, queues and intents, rebuilt
from events.

The fold is a pure function of the event sequence: ``Projection.apply`` is called
once per entry, in seq order, and nothing else mutates the state. The state is a
msgspec Struct, so a snapshot of it (saved with the seq it covers) lets a restart
fold only the tail instead of starting at seq 0.

The same fact seen by two sources (the app-server connection and the rollout file)
arrives as two events; every step here is idempotent per natural key (turn id,
item id), so a turn is one turn. Where two sources give one turn different ids (a
Claude Code transcript's message uuid, its hooks' ``prompt_id``), a ``TurnAlias``
says so before the second id is used, and every step reads a turn id through
``ThreadState.canonical_turn``: the thread knows the turn by the id seen first.
A Claude Code session seen through its hooks (and not driven over a connection) is
ended only by the hooks: a ``Stop`` the hook blocked continues the turn the
transcript already shows finished, so another source's end is held
(``ThreadState.held_end``) until the hooks end the turn or the next one starts.
"""

from __future__ import annotations

import time

import msgspec

from tillerman.ledger import events as ev
from tillerman.ledger import stopped, writers
from tillerman.ledger.events import Entry, Envelope, QueueEntry
from tillerman.ledger.intent_states import State, is_terminal
from tillerman.ledger.intents import Intent
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.id_table import IdTable
from tillerman.ledger.snapshot import (
    ENDED_TURN_STATES, GOAL_BUDGET_LIMITED, GOAL_CLEARED, TURN_STATES, ThreadGoal, ThreadSnapshot, Watched, turn_state,
)
from tillerman.ledger.spent import Spent, UsageFigures, Where, add_to, take_from
from tillerman.ledger.turn_triggers import TurnOpening, infer_trigger
from tillerman.ledger.usage import Tokens
from tillerman.ledger.usage_account import Dedup
from tillerman.ledger.writers import WriterFact

HOOK_FORMAT = "claude-hooks"  # the source format of Claude Code hook payloads (tillerman hook claude)
SNAPSHOT_NAME = "projection-v15"  # bump when Projection changes shape
#: Turns a thread keeps by id (``ThreadState.turn_states``). Older ones, all ended, move
#: to ``ThreadState.earlier_turns``: a turn is still known there (a late copy of its
#: start or end is recognised, an intent that expected it is refused) at about 14 bytes
#: instead of about 130 for an id string and its dict entry, so a session open for
#: tens of thousands of turns does not grow the fold's memory with them.
RECENT_TURNS = 32
#: The source prefix of what ``tillerman claude`` (the stream-json wrapper) records: its
#: session is steerable, through the wrapper and never through an app-server connection.
CLAUDE_WRAPPER_SOURCE = "claude-wrapper"


class RunningItem(msgspec.Struct):
    turn_id: str | None
    item_type: str
    started_at: float | None
    critical: bool = False
    external: bool = False
    tool: str | None = None
    args_digest: str | None = None
    command: str | None = None  # a shell call's command line: only with --retain-payloads


class ThreadState(msgspec.Struct):
    thread_id: str
    parent_thread_id: str | None = None
    steerable: bool = False
    wrapped: bool = False  # steered through ``tillerman claude``, which carries out its intents
    hook_delivery: bool = False  # seen through Claude Code's hooks (ThreadSnapshot.hook_delivery)
    supervised: bool = True  # False: Codex's own housekeeping (ephemeral), recorded only
    status: str | None = None
    flags: tuple[str, ...] = ()
    active_turn_id: str | None = None
    active_turn_started_at: float | None = None
    active_turn_source: str | None = None  # the source whose start made the active turn active
    turn_states: dict[str, str] = {}  # the recent turns (at most RECENT_TURNS)
    earlier_turns: IdTable | None = None  # the older ones: state index by id digest
    turn_aliases: dict[str, str] = {}  # another source's id of a recent turn -> the id the thread knows it by
    hook_source: str | None = None  # the source of its hook spool: the one that ends its turns (module doc)
    held_end: str | None = None  # how another source ended the active turn, while the hooks still run it
    last_event_at: float | None = None
    last_progress_at: float | None = None
    running: dict[str, RunningItem] = {}
    approvals: dict[str, float | None] = {}  # item id -> since
    queue: tuple[QueueEntry, ...] = ()
    queue_paused: bool = False
    failures: dict[str, tuple[int, str | None, int | None]] = {}
    client_ids: dict[str, str | None] = {}  # our clientId echoes -> the turn they landed in
    # our clientIds whose hook deny the CLI did not honour -> the call that ran anyway
    not_honoured: dict[str, str] = {}
    cwd: str | None = None  # the working directory its session named (kept with --retain-payloads only)
    goal: ThreadGoal | None = None  # Codex's thread goal as last reported (ThreadSnapshot.goal)
    # What started each recent turn: (trigger, inferred), read from the source or inferred
    # live (``tillerman.ledger.turn_triggers``); pruned with ``turn_states``.
    turn_triggers: dict[str, tuple[str, bool]] = {}
    opening: TurnOpening | None = None  # the facts of the active turn's start, while inferring
    last_turn_ended_at: float | None = None
    queued_client_ids: tuple[str, ...] = ()  # client ids lately seen in its queue (a queued turn's opener)
    # Several writers (``tillerman.ledger.writers``): who opened each recent turn, the
    # running turn's first input, another writer's message folded into it and not yet
    # answered, and the latest facts a person sees.
    turn_writers: dict[str, str] = {}
    turn_input: str | None = None
    other_input: str | None = None
    writer_facts: tuple[WriterFact, ...] = ()
    # A stopped thread (``tillerman.ledger.stopped``): the stop that stopped it, until a
    # person resumed it; our queued messages a stop withdrew (queue intent -> stop).
    stopped_by: str | None = None
    withdrawn: dict[str, str] = {}
    # What it spent per budget scope after its last counted response (``tillerman.ledger.spent``),
    # and the keys of the responses counted, so a response reported twice counts once.
    usage: UsageFigures | None = None

    def turn_state(self, turn_id: str | None) -> str | None:
        """The state of ``turn_id`` (``ThreadSnapshot.turn_state``)."""
        return turn_state(self.turn_states, self.earlier_turns, self.canonical_turn(turn_id))

    def turn_trigger(self, turn_id: str | None) -> tuple[str, bool] | None:
        """What started ``turn_id`` and whether that was inferred; None: not known."""
        return self.turn_triggers.get(self.canonical_turn(turn_id)) if turn_id is not None else None

    def canonical_turn(self, turn_id: str | None) -> str | None:
        """The id the thread knows ``turn_id``'s turn by (itself unless another source's)."""
        return self.turn_aliases.get(turn_id, turn_id) if turn_id is not None else None

    def set_turn_state(self, turn_id: str, state: str) -> None:
        """Record ``turn_id``'s state; past RECENT_TURNS, the oldest ended turn moves
        to ``earlier_turns``. At most one turn is active (a start marks the one before
        it unclosed), so an ended one is always found."""
        self.turn_states[turn_id] = state
        if len(self.turn_states) > RECENT_TURNS:
            oldest, ended = next((t, s) for t, s in self.turn_states.items() if s in ENDED_TURN_STATES)
            del self.turn_states[oldest]
            self.turn_triggers.pop(oldest, None)
            self.turn_writers.pop(oldest, None)
            for alias in [a for a, known in self.turn_aliases.items() if known == oldest]:
                del self.turn_aliases[alias]
            if self.earlier_turns is None:
                self.earlier_turns = IdTable()
            self.earlier_turns.put(oldest, TURN_STATES.index(ended))


class HistoryItem(msgspec.Struct, frozen=True):
    seq: int
    at: float | None
    kind: str  # "proposed" | "transition" | "evidence" | "decision"
    state: str
    reason: str
    evidence: dict[str, str | int | float | bool | None] = {}


class IntentView(msgspec.Struct):
    intent: Intent
    state: State = State.PROPOSED
    updated_at: float | None = None
    history: list[HistoryItem] = []
    last_decision: tuple[str, str] | None = None


class Projection(msgspec.Struct):
    seq: int = 0
    threads: dict[str, ThreadState] = {}
    intents: dict[str, IntentView] = {}
    # The ids of the open intents, in the order they were proposed: a round asks for
    # them every time, and ``intents`` keeps every settled one too (the daemon's run of
    # hours: thousands, each looked at in every round when they were filtered here).
    open_ids: dict[str, None] = {}
    # rows this version cannot decode, skipped by the fold: seq -> "kind: why"
    undecodable: dict[int, str] = {}
    # what every supervised thread spent together on the UTC day of the last counted response
    owner_day: Spent | None = None
    # which reports of a response count, and where each counted one was added (the usage
    # account's rule, across threads as ccusage dedups), for the last KEPT_DAYS UTC days
    usage_dedup: Dedup[Where] = msgspec.field(default_factory=Dedup)

    # -- the fold ---------------------------------------------------------------

    def apply(self, entry: Entry) -> None:
        self.apply_envelope(entry.envelope, entry.seq)

    def apply_envelope(self, env: Envelope, seq: int) -> None:
        """``apply`` of the row ``env`` is (or will be) at ``seq``, without its ``Entry``."""
        at = env.at if env.at is not None else env.observed_at
        if isinstance(env.event, ev.Usage) and at is not None and env.observed_at is not None:
            # A response is not charged to a time after it was seen: a forged far-future
            # time would move the budget fold's window (``Dedup.in_window``) past every
            # later response, and no budget would count again. Replay observes each
            # record at its own time or later (its clock only moves forward): unchanged.
            at = min(at, env.observed_at)
        self.seq = seq
        _APPLY.get(type(env.event), _ignore)(self, env.event, at, seq, env.source)

    def fold(self, entries) -> Projection:
        for entry in entries:
            self.apply(entry)
        return self

    # -- views ------------------------------------------------------------------

    def recorded_cwd(self, thread_id: str) -> str | None:
        """The working directory the thread's session named, when the ledger kept it."""
        t = self.threads.get(thread_id)
        return t.cwd if t else None

    def thread(self, thread_id: str) -> ThreadState:
        state = self.threads.get(thread_id)
        if state is None:
            state = self.threads[thread_id] = ThreadState(thread_id=thread_id)
        return state

    def snapshot(self, thread_id: str) -> ThreadSnapshot:
        """The frozen value the policy and the detection rules see for one thread.

        Taken at one point of the fold and used there: its turn table is the thread's
        own (copying every turn a long session ever had, for every event, made replay
        quadratic in session length), so take a new snapshot after folding more."""
        t = self.threads.get(thread_id)
        if t is None:
            return ThreadSnapshot(thread_id=thread_id, known=False)
        approval_since, critical, critical_since = _lasting(t)
        return ThreadSnapshot(
            thread_id=thread_id,
            steerable=t.steerable,
            hook_delivery=t.hook_delivery,
            wrapped=t.wrapped,
            supervised=t.supervised,
            active_turn_id=t.active_turn_id,
            active_turn_started_at=t.active_turn_started_at,
            turn_states=t.turn_states,
            earlier_turns=t.earlier_turns,
            turn_aliases=t.turn_aliases,
            last_event_at=t.last_event_at,
            last_progress_at=t.last_progress_at,
            approval_pending=bool(t.approvals),
            approval_pending_since=approval_since,
            critical_tool=critical,
            critical_tool_since=critical_since,
            external_effect_unknown=any(i.external for i in t.running.values()) if t.running else False,
            queue=t.queue,
            queue_paused=t.queue_paused,
            failures=dict(t.failures) if t.failures else {},
            goal=t.goal,
            other_writer_input=t.other_input is not None,
            stopped_by=t.stopped_by,
            withdrawn=t.withdrawn,
            usage=t.usage,
        )

    def watched(self, thread_id: str) -> Watched | None:
        """What the thread's rule triggers read (``Watched``), as its snapshot would say
        it; None for a thread never seen. Cheap enough to take after every event."""
        t = self.threads.get(thread_id)
        if t is None:
            return None
        if not (t.approvals or t.running or t.failures):  # the common case: nothing pending
            return Watched(thread_id=thread_id, supervised=t.supervised, active_turn_id=t.active_turn_id,
                           active_turn_started_at=t.active_turn_started_at, last_progress_at=t.last_progress_at,
                           goal_budget_limited_at=_budget_limited_at(t), usage=t.usage)
        approval_since, critical, critical_since = _lasting(t)
        return Watched(thread_id=thread_id, supervised=t.supervised, active_turn_id=t.active_turn_id,
                       active_turn_started_at=t.active_turn_started_at, last_progress_at=t.last_progress_at,
                       approval_pending=bool(t.approvals), approval_pending_since=approval_since,
                       critical_tool=critical, critical_tool_since=critical_since,
                       most_failures=max([c for c, _, _ in t.failures.values()], default=0),
                       goal_budget_limited_at=_budget_limited_at(t), usage=t.usage)

    def moved_at_most_progress(self, thread_id: str, old: Watched) -> bool:
        """Whether the thread's ``watched`` would read as ``old`` but for its
        ``last_progress_at``, told without building it; answered (True) only in the
        common case, nothing pending then or now: False means "build it and compare"."""
        t = self.threads.get(thread_id)
        return (t is not None and not (t.approvals or t.running or t.failures)
                and not (old.approval_pending or old.critical_tool or old.most_failures)
                and old.supervised == t.supervised and old.active_turn_id == t.active_turn_id
                and old.active_turn_started_at == t.active_turn_started_at
                and old.goal_budget_limited_at == _budget_limited_at(t) and old.usage is t.usage)

    def open_intents(self) -> list[IntentView]:
        intents = self.intents
        return [intents[i] for i in self.open_ids]


def is_open(view: IntentView) -> bool:
    return not is_terminal(view.state, view.intent)


def _budget_limited_at(t: ThreadState) -> float | None:
    """When the thread's goal reached "budgetLimited" (``Watched.goal_budget_limited_at``)."""
    goal = t.goal
    return goal.changed_at if goal is not None and goal.status == GOAL_BUDGET_LIMITED else None


def _lasting(t: ThreadState) -> tuple[float | None, bool, float | None]:
    """Since when an approval is pending, whether a critical item runs and since when:
    scans that nothing running and no approval pending (the common case) skips."""
    approval_since = min([s for s in t.approvals.values() if s is not None], default=None) if t.approvals else None
    critical = [i.started_at for i in t.running.values() if i.critical] if t.running else ()
    return (approval_since, bool(critical),
            min([s for s in critical if s is not None], default=None) if critical else None)


# -- per-kind steps --------------------------------------------------------------


def _touch(p: Projection, e: ev.Event, at: float | None, source: str) -> ThreadState | None:
    if e.thread_id is None:
        return None
    t = p.threads.get(e.thread_id) or p.thread(e.thread_id)
    if at is not None and (t.last_event_at is None or at > t.last_event_at):
        t.last_event_at = at
    if source.startswith("appserver"):
        t.steerable = True
    elif source.startswith(CLAUDE_WRAPPER_SOURCE):
        t.steerable = t.wrapped = True
    return t


def _progress(t: ThreadState, e: ev.Event, at: float | None) -> None:
    if e.turn_id is not None and t.canonical_turn(e.turn_id) == t.active_turn_id and at is not None:
        t.last_progress_at = at


def _ignore(p, e, at, seq, source) -> None:
    _touch(p, e, at, source)


def _thread_started(p, e: ev.ThreadStarted, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None and e.parent_thread_id:
        t.parent_thread_id = e.parent_thread_id
    if t is not None and not e.users_work:
        t.supervised = False
    if t is not None and e.cwd:
        t.cwd = e.cwd
    if t is not None and e.source_format == HOOK_FORMAT:
        t.hook_delivery = True
        t.hook_source = source


def _turn_alias(p, e: ev.TurnAlias, at, seq, source) -> None:
    """Two sources' ids of one turn: the one the thread already knows stays its id."""
    t = _touch(p, e, at, source)
    if t is None or e.turn_id is None or e.alias == e.turn_id:
        return
    own, other = t.canonical_turn(e.turn_id), t.canonical_turn(e.alias)
    if own == other:
        return
    if t.turn_state(other) is None:
        t.turn_aliases[e.alias] = own
    elif t.turn_state(own) is None:
        t.turn_aliases[e.turn_id] = other
    else:
        _merge_turns(t, own, other)


def _merge_turns(t: ThreadState, one: str, other: str) -> None:
    """Two sources' turns, each started before the link between them was read, are one:
    the running one keeps its id (intents may name it), and the turn ends as the
    source that saw its end said ("unclosed" only when none did)."""
    keep, drop = (other, one) if t.active_turn_id == other else (one, other)
    states = {t.turn_state(keep), t.turn_state(drop)}
    ended = sorted(states - {"active", "unclosed", "unlinked"})
    merged = "active" if "active" in states else ended[0] if ended else "unlinked" if "unlinked" in states \
        else "unclosed"
    t.turn_states.pop(drop, None)  # an older turn's entry stays in earlier_turns, unreachable by the alias
    for alias in [a for a, known in t.turn_aliases.items() if known == drop]:
        t.turn_aliases[alias] = keep
    t.turn_aliases[drop] = keep
    t.turn_states[keep] = merged


def _turn_started(p, e: ev.TurnStarted, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is None or e.turn_id is None:
        return
    if isinstance(e.trigger, str):  # the source says (a rollout): it outranks an inference
        t.turn_triggers[t.canonical_turn(e.turn_id)] = (e.trigger, e.trigger_inferred is True)
    if t.turn_state(e.turn_id) is not None:
        return  # a second source's copy, or a late start after the end: one turn
    turn = t.canonical_turn(e.turn_id)
    writers.turn_started(t, turn, at, source)
    _open_live_turn(t, turn, e, at, source)
    _close_unlinked(t)
    if t.active_turn_id is not None:
        t.set_turn_state(t.active_turn_id, t.held_end or ("unlinked" if _link_may_follow(t, source) else "unclosed"))
    t.held_end = None
    t.set_turn_state(turn, "active")
    t.active_turn_id = turn
    t.active_turn_started_at = at
    t.active_turn_source = source
    t.last_progress_at = at
    t.failures = {}
    t.queue_paused = False


def _turn_completed(p, e: ev.TurnCompleted, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is None or e.turn_id is None or t.turn_state(e.turn_id) in ENDED_TURN_STATES:
        return
    turn = t.canonical_turn(e.turn_id)
    if _held_for_the_hooks(t, turn, source):
        t.held_end = e.status
        return
    t.set_turn_state(turn, e.status)
    if t.active_turn_id == turn:
        _close_unlinked(t)
        t.last_turn_ended_at, t.opening = at, None
        writers.turn_ended(t)
        t.held_end = None
        t.active_turn_id = None
        t.active_turn_started_at = None
        t.approvals = {}  # the server resolves pending approvals when the turn ends
        t.failures = {}  # repeated failures are counted within one turn
        if e.status == "interrupted" and t.queue:
            t.queue_paused = True  # the app-server stops draining after an interrupt


def _open_live_turn(t: ThreadState, turn: str, e: ev.TurnStarted, at: float | None, source: str) -> None:
    """Gather what the trigger inference reads of a turn the app-server started: the
    wire does not say what started it (``tillerman.ledger.turn_triggers``)."""
    t.opening = None
    if isinstance(e.trigger, str) or not source.startswith("appserver"):
        return
    goal_active = t.goal is not None and t.goal.active
    since = [s for s in (t.last_turn_ended_at, t.goal.changed_at if goal_active else None) if s is not None]
    t.opening = TurnOpening(goal_active, at - max(since) if since and at is not None else None)
    t.turn_triggers.setdefault(turn, (infer_trigger(t.opening), True))


def _first_input(p: Projection, t: ThreadState, e: ev.Event) -> None:
    """The active turn's first input settles its inferred trigger: a user message (a
    queued one by its client id) or anything else."""
    if t.opening is None or t.opening.first_input is not None or t.canonical_turn(e.turn_id) != t.active_turn_id:
        return
    first = "none"
    if isinstance(e, ev.UserMessage):
        first = "queue" if _queued(p, t, e.client_id) else "user"
    t.opening = msgspec.structs.replace(t.opening, first_input=first)
    turn = t.active_turn_id
    if t.turn_triggers.get(turn, ("", True))[1]:  # never over a trigger the source said
        t.turn_triggers[turn] = (infer_trigger(t.opening), True)


def _queued(p: Projection, t: ThreadState, client_id: str | None) -> bool:
    """Whether a user message's client id is a queued message's: seen in the thread's
    queue, or one of tillerman's queue intents (``Intent.client_user_message_id``)."""
    if client_id is None:
        return False
    if client_id in t.queued_client_ids:
        return True
    view = p.intents.get(client_id.removeprefix("tillerman-")) if client_id.startswith("tillerman-") else None
    return view is not None and view.intent.mode == "queue"


def _link_may_follow(t: ThreadState, source: str) -> bool:
    """Whether the running turn and the one ``source`` starts now may be one turn whose
    link is still to come: one the hooks' (``prompt_id``), the other ``tillerman
    claude``'s (stream-json's uuid). The wrapper reads the link from the transcript's
    prompt line, which the real CLI writes after it opens the turn on stdout, and the
    hooks' start comes before or after the wrapper's as the daemon reads the spool: the
    link lands after both starts. Until it does, or the turn that started now is over,
    the running turn is ``unlinked``, not ended, so no intent's verdict rests on the
    end one source inferred. (A transcript records its link before its start.)"""
    sources = (t.active_turn_source, source)
    return t.hook_source is not None and t.hook_source in sources \
        and any(s is not None and s.startswith(CLAUDE_WRAPPER_SOURCE) for s in sources)


def _close_unlinked(t: ThreadState) -> None:
    """The turn that left another ``unlinked`` is over (ended, or another started): no
    link came in its time, so the other is ``unclosed``, as with one source."""
    for turn in [turn for turn, state in t.turn_states.items() if state == "unlinked"]:
        t.turn_states[turn] = "unclosed"


def _held_for_the_hooks(t: ThreadState, turn: str, source: str) -> bool:
    """Whether another source's end of the running turn waits for the hooks': in a
    session delivered to through its hooks, only they know a Stop they blocked went on."""
    return t.hook_source is not None and source != t.hook_source and not t.steerable and turn == t.active_turn_id


def _item_started(p, e: ev.ItemStarted, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is None:
        return
    _progress(t, e, at)
    _first_input(p, t, e)
    writers.model_output(t, e, source)
    if e.item_id not in t.running:
        t.running[e.item_id] = RunningItem(t.canonical_turn(e.turn_id), e.item_type, at, e.critical, e.external, e.tool,
                                             e.args_digest, e.command or None)


def _item_completed(p, e: ev.ItemCompleted, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is None:
        return
    _progress(t, e, at)
    started = t.running.pop(e.item_id, None)
    t.approvals.pop(e.item_id, None)
    # a format may name the arguments only where the call starts: take them from there
    args_digest = e.args_digest or (started.args_digest if started else None)
    tool = e.tool or (started.tool if started else None)
    failed = e.status == "failed" or (e.exit_code not in (None, 0))
    if failed and t.canonical_turn(e.turn_id) == t.active_turn_id and args_digest:
        count, _, _ = t.failures.get(args_digest, (0, None, None))
        t.failures[args_digest] = (count + 1, tool, e.exit_code)


def _user_message(p, e: ev.UserMessage, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is None:
        return
    _progress(t, e, at)
    _first_input(p, t, e)
    stopped.resumed_by_turn(t, writers.user_message(t, e, at, source))
    if e.client_id and e.client_id.startswith("tillerman-"):
        t.client_ids.setdefault(e.client_id, t.canonical_turn(e.turn_id))


def _deny_not_honoured(p, e: ev.DenyNotHonoured, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        t.not_honoured.setdefault(e.client_id, e.item_id)


def _agent_message(p, e: ev.AgentMessage, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        _progress(t, e, at)
        _first_input(p, t, e)
        writers.model_output(t, e, source)


def _goal_updated(p, e: ev.GoalUpdated, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        stopped.resumed_by_goal(t, t.goal.status if t.goal else None, e.status, e.by, source.startswith("appserver"),
                                e.turn_id)
        _set_goal(t, e.status, at, e.by, e.turn_id, objective_digest=e.objective_digest, origin=e.origin,
                  token_budget=e.token_budget, tokens_used=e.tokens_used, time_used_seconds=e.time_used_seconds)


def _goal_cleared(p, e: ev.GoalCleared, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    # Codex reports "cleared" on every thread/resume of a thread with no goal (its goal
    # snapshot): there is nothing to clear then, and the thread still never had a goal.
    if t is not None and t.goal is not None:
        _set_goal(t, GOAL_CLEARED, at, e.by, e.turn_id)


def _usage(p, e: ev.Usage, at, seq, source) -> None:
    """A response's usage, counted once into each budget scope it falls in; a better
    duplicate of a counted one replaces it (``Dedup``, the usage account's rule)."""
    t = _touch(p, e, at, source)
    if t is None:
        return
    # Only a response in the dedup's window is charged: an older one falls in no turn or
    # day a budget still counts, and its earlier copies' keys may be forgotten already.
    epoch_day = int(at // 86400) if at is not None else None
    if epoch_day is not None and not p.usage_dedup.in_window(epoch_day):
        return
    if not p.usage_dedup.first_report(e, epoch_day):
        return
    tokens, model, speed = e.tokens, e.model, e.speed
    day = time.strftime("%Y-%m-%d", time.gmtime(at)) if at is not None else None
    turn = t.canonical_turn(e.turn_id) or t.active_turn_id
    goal = t.goal if t.goal is not None and t.goal.status != GOAL_CLEARED else None
    where = Where(thread_id=t.thread_id, turn=turn, day=day, goal=goal and (goal.objective_digest or "goal"),
                  owner=t.supervised, model=model, speed=speed)
    counts, replaced = p.usage_dedup.admit(e, where, epoch_day)
    if not counts:
        return
    if replaced is not None:
        _take_back(p, replaced.place, replaced.tokens)
    old = t.usage
    if t.supervised:
        p.owner_day = add_to(p.owner_day, day, tokens, model, speed)
    t.usage = UsageFigures(
        thread=add_to(old.thread if old else None, "thread", tokens, model, speed),
        turn=add_to(old.turn if old else None, turn, tokens, model, speed),
        day=add_to(old.day if old else None, day, tokens, model, speed),
        goal=add_to(old.goal if old else None, where.goal, tokens, model, speed),
        owner=p.owner_day if t.supervised else None,
        last_input=tokens.input, context_window=e.context_window or (old.context_window if old else None),
        model=model, source_kind=e.source_kind, seq=seq)


def _take_back(p: Projection, where: Where, tokens: Tokens) -> None:
    """An earlier copy of a response, replaced by a better one, leaves the scopes it was
    counted in (those still current: a finished turn or day keeps what it held)."""
    if where.owner:
        p.owner_day = take_from(p.owner_day, where.day, tokens, where.model, where.speed)
    earlier = p.threads.get(where.thread_id)
    if earlier is not None and earlier.usage is not None:
        earlier.usage = earlier.usage.without(where, tokens, p.owner_day)


def _set_goal(t: ThreadState, status: str, at: float | None, by: str | None, turn_id: str | None, **fields) -> None:
    """The goal as reported now. ``changed_at``/``changed_by`` move only when the status
    does: every turn's end reports the goal again, mostly with more tokens used."""
    old = t.goal
    changed_at, changed_by = (at, by) if old is None or old.status != status else (old.changed_at, old.changed_by)
    t.goal = ThreadGoal(status=status, changed_at=changed_at, changed_by=changed_by, updated_at=at,
                        turn_id=t.canonical_turn(turn_id), **fields)


def _approval_requested(p, e: ev.ApprovalRequested, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        t.approvals.setdefault(e.item_id, at)


def _approval_resolved(p, e: ev.ApprovalResolved, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        t.approvals.pop(e.item_id, None)
        # The answer is progress: without it the quiet timer ran from the item's start,
        # so the whole approval wait counted as quiet and a turn_quiet rule fired the
        # moment the person answered (tests/live/test_daemon_live.py, approval case).
        _progress(t, e, at)


def _queue_changed(p, e: ev.QueueChanged, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None and e.known:
        t.queue = e.entries
        seen = [entry.client_id for entry in e.entries if entry.client_id and entry.client_id not in t.queued_client_ids]
        if seen:
            t.queued_client_ids = (*t.queued_client_ids, *seen)[-RECENT_TURNS:]


def _status_changed(p, e: ev.StatusChanged, at, seq, source) -> None:
    t = _touch(p, e, at, source)
    if t is not None:
        t.status, t.flags = e.status, e.flags


def _intent_proposed(p, e: ev.IntentProposed, at, seq, source) -> None:
    view = p.intents[e.intent.id] = IntentView(
        intent=e.intent, state=State.PROPOSED, updated_at=at,
        history=[HistoryItem(seq, at, "proposed", "proposed", e.intent.producer)],
    )
    _keep_open(p, view)


def _intent_transition(p, e: ev.IntentTransition, at, seq, source) -> None:
    view = p.intents.get(e.intent_id)
    if view is None:
        return
    try:
        state = State(e.to_state)
    except ValueError:
        # A state this version does not know (a newer tillerman, or a forged row): the
        # ledger never writes one, so the row is reported and skipped like an undecodable
        # one; the intent stays where the last known move left it.
        p.undecodable[seq] = f"intent_transition: unknown intent state {e.to_state!r}"
        return
    view.state, view.updated_at = state, at
    view.history.append(HistoryItem(seq, at, "transition", state, e.reason, e.evidence))
    _keep_open(p, view)
    if (t := p.threads.get(view.intent.thread_id)) is not None:
        stopped.intent_moved(t, view.intent, state)


def _keep_open(p: Projection, view: IntentView) -> None:
    intent_id = view.intent.id
    if not is_open(view):
        p.open_ids.pop(intent_id, None)
    elif intent_id not in p.open_ids:
        if next(reversed(p.intents)) == intent_id:  # the newest proposal: its place is last
            p.open_ids[intent_id] = None
        else:  # an older one open again (a forged move, an id proposed twice): the ledger writes neither
            p.open_ids = {i: None for i, v in p.intents.items() if is_open(v)}


def _intent_evidence(p, e: ev.IntentEvidence, at, seq, source) -> None:
    view = p.intents.get(e.intent_id)
    if view is not None:
        view.history.append(HistoryItem(seq, at, "evidence", e.state, e.reason, e.evidence))
        if e.reason == stopped.WITHDRAWN_EVIDENCE and e.evidence.get("deleted") is True:
            _withdrawn(p, str(e.evidence.get("intent_id")), e.intent_id)


def _withdrawn(p: Projection, queue_intent_id: str, stop_intent_id: str) -> None:
    """A stop deleted an open queue intent's message from the server's queue."""
    queued = p.intents.get(queue_intent_id)
    if queued is not None and is_open(queued):
        stopped.queue_withdrawn(p.thread(queued.intent.thread_id), queue_intent_id, stop_intent_id)


def _decision(p, e: ev.DecisionRecorded, at, seq, source) -> None:
    view = p.intents.get(e.intent_id)
    if view is not None and not e.shadow:
        view.last_decision = (e.action, e.reason)
        view.history.append(HistoryItem(seq, at, "decision", e.action, e.reason))


def _undecodable(p, e: ev.Undecodable, at, seq, source) -> None:
    p.undecodable[seq] = f"{e.stored_kind}: {e.error}"


_APPLY = {
    ev.Undecodable: _undecodable,
    ev.ThreadStarted: _thread_started,
    ev.TurnStarted: _turn_started,
    ev.TurnAlias: _turn_alias,
    ev.TurnCompleted: _turn_completed,
    ev.ItemStarted: _item_started,
    ev.ItemCompleted: _item_completed,
    ev.UserMessage: _user_message,
    ev.AgentMessage: _agent_message,
    ev.DenyNotHonoured: _deny_not_honoured,
    ev.GoalUpdated: _goal_updated,
    ev.GoalCleared: _goal_cleared,
    ev.Usage: _usage,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalResolved: _approval_resolved,
    ev.QueueChanged: _queue_changed,
    ev.StatusChanged: _status_changed,
    ev.IntentProposed: _intent_proposed,
    ev.IntentTransition: _intent_transition,
    ev.IntentEvidence: _intent_evidence,
    ev.DecisionRecorded: _decision,
}

_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(Projection)


def load(recorder: Recorder) -> Projection:
    """The current projection: the saved snapshot plus a fold of the tail after it. A
    snapshot that claims more than the chain holds is not trusted (``ledger verify``
    checks the rest: it folds the chain again and compares)."""
    saved = recorder.load_snapshot(SNAPSHOT_NAME)
    projection = None
    if saved is not None and saved[0] <= recorder.max_seq():
        projection = decode_state(saved[1])  # an unreadable snapshot only costs a full re-fold
    projection = projection or Projection()
    return projection.fold(recorder.read(after_seq=projection.seq))


def decode_state(state: bytes) -> Projection | None:
    try:
        return _state_decoder.decode(state)
    except msgspec.DecodeError:
        return None


def save(recorder: Recorder, projection: Projection) -> None:
    recorder.save_snapshot(SNAPSHOT_NAME, projection.seq, _state_encoder.encode(projection))
