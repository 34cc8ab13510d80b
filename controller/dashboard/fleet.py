"""The fleet: one row per supervised thread, those that need a person first.

A pure function of the ledger's projection, its usage account and the time now: the
page, its live updates and its tests all call ``fleet_rows`` with what they read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import PurePath

import msgspec

from tillerman.controller.core.overdue import overdue
from tillerman.controller.core.timefmt import iso, shorten
from tillerman.controller.report.fold import STALL_FINDING
from tillerman.controller.report.usage import Figures, UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry
from tillerman.ledger.projections import HOOK_FORMAT, Projection, ThreadState

#: A thread's state as a person reads it, in the order the fleet shows them: what needs
#: a person first. ``waiting``: an approval waits on the owner; ``stalled``: a turn runs
#: but nothing has moved for the stall window; ``working``: a turn runs; ``idle``: no
#: turn runs; ``stopped``: a stop intent stopped it; ``done``: its session ended.
STATES = ("waiting", "stalled", "working", "idle", "stopped", "done")


class FleetRow(msgspec.Struct, frozen=True, kw_only=True):
    thread_id: str
    name: str  # what a person recognises: its title, its first prompt, its project or cwd; never only the id
    project: str | None  # the cwd's last part
    branch: str | None  # the git branch, where known
    agent: str  # "codex" | "claude"
    source: str  # "codex live", "claude hooks", "claude wrapper", "claude transcript", "codex rollout", ...
    state: str  # one of STATES
    state_since: float | None  # when it entered that state
    running_tool: str | None  # the command or tool running now
    running_since: float | None
    goal_status: str | None  # Codex's thread goal, where it has one
    tokens_today: int  # input + output counted today (the owner's zone)
    cost_today_usd: float | None  # None: a response today with no known price
    context_use: float | None  # the last response's input over its model's context window
    open_intents: int
    overdue: int
    last_event_at: float | None
    last_event: str | None  # its kind, as a person reads it


#: How long a running turn may go without progress before the fleet calls it stalled,
#: when the rules reported no stall of it first (the built-in rules' ``turn_quiet`` window).
STALL_AFTER = 600.0
#: A first prompt shown as the name is cut to this many characters.
NAME_LENGTH = 60
#: A running command is shown by its first line, cut to this many characters.
RUNNING_LENGTH = 60
#: Item types as a person reads them, where no command or tool names the call; any
#: other camelCase type is spelled out in words.
ITEM_TYPES = {"commandExecution": "command", "mcpToolCall": "MCP tool call"}
#: How each source format reads on the page, best first: where a thread is seen by
#: several, the live one names it (a transcript of a session the hooks also report).
SOURCES = {
    "appserver": ("codex", "codex live"),
    "claude-stream-json": ("claude", "claude wrapper"),
    HOOK_FORMAT: ("claude", "claude hooks"),
    "claude-hook-log": ("claude", "claude hooks"),
    "claude-transcript": ("claude", "claude transcript"),
    "codex-rollout": ("codex", "codex rollout"),
    "codex-tui": ("codex", "codex tui"),
    "codex-exec": ("codex", "codex exec"),
    "appserver-trace": ("codex", "codex trace"),
}
_SOURCE_RANK = {label: i for i, label in enumerate(dict.fromkeys(SOURCES.values()))}
#: The statuses of a thread whose session ended: Codex's ``notLoaded`` (no app-server
#: holds it: ``thread/closed``, or a status change saying so) and ``SESSION_ENDED`` (a
#: Claude Code ``SessionEnd`` hook, or the CLI under ``tillerman claude`` exited).
DONE_STATUSES = frozenset({ev.NOT_LOADED, ev.SESSION_ENDED})


class Seen(msgspec.Struct, kw_only=True):
    """What the fleet shows of a thread that the ledger's projection does not keep: how it
    is seen, what it is called, where it works, and its last event."""

    agent: str | None = None
    source: str | None = None
    first_at: float | None = None
    title: str | None = None  # the latest title its sources gave it (``thread_named``)
    first_prompt: str | None = None  # its first prompt's text (kept with --retain-payloads only)
    cwd: str | None = None
    project: str | None = None
    git_branch: str | None = None
    ended_at: float | None = None  # when its source said the session ended; a later turn reopens it
    last_at: float | None = None
    last_kind: str | None = None
    stalled_turn: str | None = None  # the turn a rule last reported stalled (``turn_quiet``), and when
    stalled_at: float | None = None


class Sightings:
    """The fold of ``Seen`` per thread, one entry at a time (``apply``), in seq order:
    the page folds the ledger once and the live feed folds what it appends."""

    def __init__(self) -> None:
        self.threads: dict[str, Seen] = {}

    def fold(self, entries: Iterable[Entry]) -> Sightings:
        for entry in entries:
            self.apply(entry)
        return self

    def apply(self, entry: Entry) -> None:
        env = entry.envelope
        event = env.event
        if event.thread_id is None:
            return
        seen = self.threads.get(event.thread_id)
        if seen is None:
            seen = self.threads[event.thread_id] = Seen()
        at = env.at if env.at is not None else env.observed_at
        if at is not None and (seen.first_at is None or at < seen.first_at):
            seen.first_at = at
        if at is not None and (seen.last_at is None or at >= seen.last_at):
            seen.last_at, seen.last_kind = at, ev.kind_of(event)
        if isinstance(event, ev.ThreadStarted):
            _started(seen, event)
        elif isinstance(event, ev.UserMessage) and seen.first_prompt is None and event.text:
            seen.first_prompt = event.text
        elif isinstance(event, ev.ThreadNamed):
            seen.title = event.name
        elif isinstance(event, ev.StatusChanged):
            seen.ended_at = at if event.status in DONE_STATUSES else None
        elif isinstance(event, ev.TurnStarted) and seen.ended_at is not None and (at is None or at > seen.ended_at):
            seen.ended_at = None  # a resumed session's turn (a source read late may tell of turns before the end)
        elif isinstance(event, ev.Report) and event.turn_id is not None and STALL_FINDING.match(event.finding):
            seen.stalled_turn, seen.stalled_at = event.turn_id, at


def _started(seen: Seen, event: ev.ThreadStarted) -> None:
    found = SOURCES.get(event.source_format or "")
    if found is not None and (seen.source is None or _SOURCE_RANK[found] < _SOURCE_RANK[(seen.agent, seen.source)]):
        seen.agent, seen.source = found
    seen.cwd = event.cwd or seen.cwd
    seen.project = event.project or seen.project or (_last_part(event.cwd) if event.cwd else None)
    seen.git_branch = event.git_branch or seen.git_branch


def _last_part(path: str) -> str | None:
    return PurePath(path).name or None


def fleet_rows(projection: Projection, usage: UsageReport, now: float, seen: dict[str, Seen], *,
               stall_after: float = STALL_AFTER, resolved_at: Mapping[str, float] | None = None) -> list[FleetRow]:
    """One row per supervised thread, those that need a person first (``attention``).

    ``usage``: a ``UsageReport`` by session over today (``since=until=`` today's date in
    the owner's zone), fed the ledger's usage; ``seen``: ``Sightings.threads``;
    ``resolved_at``: the notices a person resolved (``overdue``'s argument), not counted
    overdue. Codex's housekeeping threads (unsupervised) are no one's work and have no row."""
    open_by_thread = Counter(view.intent.thread_id for view in projection.open_intents())
    overdue_by_thread = Counter(o.thread_id for o in overdue(projection, now, resolved_at))
    today = usage.rows()
    rows = [_row(t, seen.get(thread_id) or Seen(), projection, usage, today.get((thread_id,)), now, stall_after,
                 open_by_thread[thread_id], overdue_by_thread[thread_id])
            for thread_id, t in projection.threads.items() if t.supervised]
    return sorted(rows, key=attention)


def fleet_row(projection: Projection, usage: UsageReport, now: float, seen: dict[str, Seen], thread_id: str, *,
              stall_after: float = STALL_AFTER, resolved_at: Mapping[str, float] | None = None) -> FleetRow | None:
    """``thread_id``'s row of ``fleet_rows`` (None: no such supervised thread), without
    building the others: a thread's page needs only its own."""
    t = projection.threads.get(thread_id)
    if t is None or not t.supervised:
        return None
    open_intents = sum(1 for view in projection.open_intents() if view.intent.thread_id == thread_id)
    overdue_items = sum(1 for o in overdue(projection, now, resolved_at) if o.thread_id == thread_id)
    today = usage.rows().get((thread_id,))
    return _row(t, seen.get(thread_id) or Seen(), projection, usage, today, now, stall_after, open_intents,
                overdue_items)


def _row(t: ThreadState, seen: Seen, projection: Projection, usage: UsageReport, today: Figures | None, now: float,
         stall_after: float, open_intents: int, overdue_items: int) -> FleetRow:
    state, since = state_of(t, seen, projection, now, stall_after)
    agent, source = (seen.agent, seen.source) if seen.source is not None else _connection(t)
    running = max(t.running.values(), key=lambda item: item.started_at or 0.0) if t.running else None
    return FleetRow(
        thread_id=t.thread_id, name=name_of(t.thread_id, seen), project=seen.project, branch=seen.git_branch,
        agent=agent, source=source, state=state, state_since=since,
        running_tool=call_label(running.command, running.tool, running.item_type) if running else None,
        running_since=running.started_at if running else None,
        goal_status=t.goal.status if t.goal is not None else None,
        tokens_today=today.tokens.total if today is not None else 0,
        cost_today_usd=today.cost_usd if today is not None else 0.0,
        context_use=usage.context(t.thread_id)["context_use"], open_intents=open_intents, overdue=overdue_items,
        last_event_at=t.last_event_at, last_event=seen.last_kind.replace("_", " ") if seen.last_kind else None)


def call_label(command: str | None, tool: str | None, item_type: str) -> str:
    """What a call reads as in a line: its command's first line (kept only with
    --retain-payloads), cut to ``RUNNING_LENGTH``; else its tool; else its type in words."""
    if command:
        return shorten(command.strip().split("\n", 1)[0], RUNNING_LENGTH)
    return tool or item_type_words(item_type)


def item_type_words(item_type: str) -> str:
    """``commandExecution`` as "command", ``fileChange`` as "file change"."""
    return ITEM_TYPES.get(item_type) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", item_type).lower()


def state_of(t: ThreadState, seen: Seen, projection: Projection, now: float,
             stall_after: float = STALL_AFTER) -> tuple[str, float | None]:
    """The thread's state (``STATES``) and since when. A session that ended is done
    whatever was left open in it; an approval waiting is asked of the owner even on a
    stopped thread; a running turn is stalled when a rule reported it so (and nothing moved
    since) or nothing moved in it for ``stall_after`` seconds."""
    if seen.ended_at is not None:
        return "done", seen.ended_at
    if t.approvals:
        return "waiting", min([s for s in t.approvals.values() if s is not None], default=None)
    if t.stopped_by is not None:
        stop = projection.intents.get(t.stopped_by)
        return "stopped", stop.updated_at if stop is not None else None
    if t.active_turn_id is not None:
        quiet_since = t.last_progress_at or t.active_turn_started_at
        reported = seen.stalled_turn == t.active_turn_id and (
            quiet_since is None or seen.stalled_at is None or seen.stalled_at >= quiet_since)
        if reported or (quiet_since is not None and now - quiet_since >= stall_after):
            return "stalled", quiet_since
        return "working", t.active_turn_started_at
    return "idle", t.last_turn_ended_at or t.last_event_at


def _connection(t: ThreadState) -> tuple[str, str]:
    """The agent and source of a thread whose start was not recorded, from what carries
    intents to it (as ``tillerman status`` tells it)."""
    if t.wrapped:
        return "claude", "claude wrapper"
    if t.steerable:
        return "codex", "codex live"
    return ("claude", "claude hooks") if t.hook_delivery else ("unknown", "files")


def name_of(thread_id: str, seen: Seen) -> str:
    """What a person recognises the thread by: its title (kept always), its first prompt
    (where payloads are kept), its project and branch, its working directory; never only
    its id: as a last resort, the agent, a short id and when it started."""
    if seen.title:
        return shorten(seen.title, NAME_LENGTH)
    if seen.first_prompt:
        return shorten(" ".join(seen.first_prompt.split()), NAME_LENGTH)
    if seen.project:
        return f"{seen.project} ({seen.git_branch})" if seen.git_branch else seen.project
    if seen.cwd:
        return seen.cwd
    started = iso(seen.first_at)
    return " ".join(part for part in (seen.agent or "thread", thread_id[:8], started[:16] if started else None)
                    if part)


def attention(row: FleetRow) -> tuple:
    """The fleet's order, what needs a person first: an approval waiting, then a stalled
    turn, then any thread with an overdue intent, then the rest by ``STATES``; within
    one, the longest in its state first."""
    rank = STATES.index(row.state)
    if row.overdue and row.state not in ("waiting", "stalled", "done"):
        rank = 1.5  # after the stalled, before the working
    return (rank, row.state_since is None, row.state_since or 0.0, row.name, row.thread_id)


#: The page's sort keys: each a key function and whether it sorts largest first.
#: Rows without the figure sort last either way.
SORT_KEYS = {
    "attention": None,
    "name": (lambda r: r.name.casefold(), False),
    "project": (lambda r: (r.project or "").casefold() or None, False),
    "state": (lambda r: STATES.index(r.state), False),
    "since": (lambda r: r.state_since, False),
    "tokens": (lambda r: r.tokens_today, True),
    "cost": (lambda r: r.cost_today_usd, True),
    "context": (lambda r: r.context_use, True),
    "last_event": (lambda r: r.last_event_at, True),
}


def sort_rows(rows: Iterable[FleetRow], key: str = "attention") -> list[FleetRow]:
    """``rows`` sorted by one of ``SORT_KEYS`` (ties in the fleet's own order)."""
    ordered = sorted(rows, key=attention)
    if SORT_KEYS[key] is None:
        return ordered
    get, largest_first = SORT_KEYS[key]
    known = [r for r in ordered if get(r) is not None]
    return sorted(known, key=get, reverse=largest_first) + [r for r in ordered if get(r) is None]


def filter_rows(rows: Iterable[FleetRow], state: str | None = None, agent: str | None = None,
                project: str | None = None, text: str | None = None) -> list[FleetRow]:
    """The rows in ``state``, of ``agent``, in ``project`` and mentioning ``text`` (in
    their name, project, branch, id or running tool, any case); None: any."""
    needle = text.casefold() if text else None
    return [r for r in rows
            if (state is None or r.state == state) and (agent is None or r.agent == agent)
            and (project is None or r.project == project)
            and (needle is None or any(needle in v.casefold() for v in (r.name, r.project, r.branch, r.thread_id,
                                                                         r.running_tool) if v))]
