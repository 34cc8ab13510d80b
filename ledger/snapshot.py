"""What the policy and the detection rules may know about one thread: a small frozen
value built from the projections. ``rules`` sees only this, never the ledger."""

from __future__ import annotations

import msgspec

from tillerman.ledger.events import QueueEntry
from tillerman.ledger.id_table import IdTable
from tillerman.ledger.spent import UsageFigures

#: Turn states in a snapshot: "active", or how it ended ("completed", "interrupted",
#: "failed"), or "unclosed" (the next turn started, or the source ended, first), or
#: "unlinked": another source started a turn while this one ran, and the two may be one
#: turn whose link (``TurnAlias``) is still to come (``tillerman.ledger.projections``):
#: not known to have ended, so nothing is decided on its end yet.
TURN_STATES = ("active", "completed", "interrupted", "failed", "unclosed", "unlinked")
#: The turn states after which nothing more happens in a turn.
ENDED_TURN_STATES = frozenset(TURN_STATES) - {"active", "unlinked"}


#: The goal status under which Codex starts a continuation turn after every turn; the
#: others ("paused", "complete", "budgetLimited", ...) and "cleared" start none.
GOAL_ACTIVE = "active"
#: The status a goal reads once it was cleared (``thread/goal/cleared``).
GOAL_CLEARED = "cleared"
#: The goal spent its token budget: Codex lets the running turn end and starts no more.
GOAL_BUDGET_LIMITED = "budgetLimited"
#: The statuses in which Codex stopped a goal's work by itself, for a reason a person
#: has to act on (a budget, the account's usage limit, a goal it reports blocked),
#: unlike "complete" (done) or "paused" (a client paused it).
GOAL_HALTED = frozenset({GOAL_BUDGET_LIMITED, "usageLimited", "blocked"})


class ThreadGoal(msgspec.Struct, frozen=True, kw_only=True):
    """A thread's goal as its last ``goal_updated`` (or ``goal_cleared``) said: Codex
    starts a continuation turn after every turn while ``status`` is "active"."""

    status: str  # "active" | "paused" | "complete" | "budgetLimited" | ... | "cleared"
    objective_digest: str | None = None
    origin: str | None = None  # "user" | "automatic", as the client that set it said
    token_budget: int | None = None
    tokens_used: int | None = None
    time_used_seconds: float | None = None
    changed_at: float | None = None  # when the status last changed (not every update)
    changed_by: str | None = None  # "tillerman" when our own request changed it
    updated_at: float | None = None  # the last report of it
    turn_id: str | None = None  # the turn whose end the last report came with

    @property
    def active(self) -> bool:
        return self.status == GOAL_ACTIVE


class ThreadSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    thread_id: str
    known: bool = True  # any event for this thread was seen
    steerable: bool = False  # a live app-server connection observes it (not file-only)
    # Claude Code's hooks report it (``tillerman hook claude``): a queued message can be
    # delivered at a Stop, a steer with ``deliver_at="pre_tool_use"`` at a PreToolUse.
    hook_delivery: bool = False
    # Steered through ``tillerman claude`` (a stream-json wrapper), not an app-server:
    # what it carries out is the wrapper's (a Claude Code session has no goal to pause).
    wrapped: bool = False
    supervised: bool = True  # False: Codex's own ephemeral housekeeping thread; nothing is decided
    active_turn_id: str | None = None
    active_turn_started_at: float | None = None
    turn_states: dict[str, str] = {}  # turn id -> one of TURN_STATES: the thread's recent turns
    # Its older turns, all ended, by the digest of their id: their index in TURN_STATES
    # (``tillerman.ledger.projections.RECENT_TURNS`` says why).
    earlier_turns: IdTable | None = None
    # Another source's id of a turn -> the id the thread knows it by (``TurnAlias``):
    # a turn is found, and is the active one, under either.
    turn_aliases: dict[str, str] = {}
    last_event_at: float | None = None
    last_progress_at: float | None = None  # last item/message activity in the active turn
    approval_pending: bool = False
    approval_pending_since: float | None = None
    critical_tool: bool = False  # a critical item is running
    critical_tool_since: float | None = None
    external_effect_unknown: bool = False  # an external item started without completion
    queue: tuple[QueueEntry, ...] = ()
    queue_paused: bool = False
    # repeated failures in the active turn: args digest -> (count, tool, last exit code)
    failures: dict[str, tuple[int, str | None, int | None]] = {}
    # Codex's thread goal, as last reported (None: the thread never had one seen).
    goal: ThreadGoal | None = None
    # Another writer's message was folded into the running turn and no agent message has
    # answered it yet (``tillerman.ledger.writers``): tillerman's steer and queue wait.
    other_writer_input: bool = False
    # The stop intent that stopped the thread (acknowledged or verified), until a person
    # resumed it (docs/goals.md "Stopping a thread"): rules' and reviewers' intents wait.
    stopped_by: str | None = None
    # tillerman's queued messages a stop deleted from the server's queue: queue intent id
    # -> the stop's intent id, until that queue intent settles (``withdrawn``).
    withdrawn: dict[str, str] = {}
    # What it spent per budget scope after its last counted response; None: nothing yet.
    usage: UsageFigures | None = None

    @property
    def goal_status(self) -> str | None:
        """The goal's status ("active", "paused", "complete", "budgetLimited", ...,
        "cleared"), or None when no goal was ever seen on the thread."""
        return self.goal.status if self.goal is not None else None

    @property
    def goal_active(self) -> bool:
        """Whether Codex will start more turns by itself: the thread's goal is active."""
        return self.goal is not None and self.goal.active

    def turn_state(self, turn_id: str | None) -> str | None:
        """The state of ``turn_id`` (or of the turn it is another source's id of): one of
        TURN_STATES, or None when never seen."""
        return turn_state(self.turn_states, self.earlier_turns, self.turn_aliases.get(turn_id, turn_id))

    def is_active(self, turn_id: str | None) -> bool:
        """Whether ``turn_id`` names the running turn, under any source's id of it."""
        return turn_id is not None and self.active_turn_id == self.turn_aliases.get(turn_id, turn_id)

    def same_turn(self, one: str | None, other: str | None) -> bool:
        """Whether two ids name one turn (two sources' ids of it included): every check of
        a turn id against an intent's expected turn asks this, never ``==``."""
        return one is not None and other is not None and \
            self.turn_aliases.get(one, one) == self.turn_aliases.get(other, other)

    def turn_ids(self, turn_id: str | None) -> tuple[str, ...]:
        """Every id the sources give the turn ``turn_id`` names, that one first."""
        if turn_id is None:
            return ()
        known = self.turn_aliases.get(turn_id, turn_id)
        others = [a for a, k in self.turn_aliases.items() if k == known and a != turn_id]
        return (turn_id, *([known] if known != turn_id else []), *others)


class Watched(msgspec.Struct, frozen=True, kw_only=True):
    """What a thread's rule triggers read of it (``tillerman.rules.detect.triggers``):
    the fields of its ``ThreadSnapshot`` that say what is lasting since when, and how
    often a command failed. Built after every event replay folds, so it is the small
    part of a snapshot, without the turn table, the queue or the failures themselves:
    two equal ones have equal triggers."""

    thread_id: str
    supervised: bool = True
    active_turn_id: str | None = None
    active_turn_started_at: float | None = None
    last_progress_at: float | None = None
    approval_pending: bool = False
    approval_pending_since: float | None = None
    critical_tool: bool = False
    critical_tool_since: float | None = None
    most_failures: int = 0  # the count of the command that failed most often in the active turn
    # When the thread's goal reached "budgetLimited" (None: its goal is in another status)
    goal_budget_limited_at: float | None = None
    # Its budget figures (``ThreadSnapshot.usage``): the same object until a response is counted
    usage: UsageFigures | None = None


def turn_state(recent: dict[str, str], earlier: IdTable | None, turn_id: str | None) -> str | None:
    """The state of ``turn_id`` in a thread's turn table: its recent turns by id, then
    its earlier ones by digest; None when it was never seen."""
    if turn_id is None:
        return None
    state = recent.get(turn_id)
    if state is None and earlier is not None:
        index = earlier.get(turn_id)
        state = None if index is None else TURN_STATES[index]
    return state
