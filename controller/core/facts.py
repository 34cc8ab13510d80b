"""What the driver tells a delivery machine: the facts it is handed, one at a time.

A fact is a decision to act on (``Dispatch``, ``Reconcile``, ``VerifyDue``), a server's
answer to one of the machine's commands (``Replied``, ``Refused``, ``NoAnswer``), an
observation on the intent's thread (``Observed``), a readback's result (``Verified``) or
the clock (``Tick``). Replies arrive typed (``tillerman.monitor.codex_wire``), so a
machine never walks JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tillerman.controller.core.commands import Command
from tillerman.controller.core.rpc_errors import EvidenceValue, Refusal
from tillerman.ledger.events import Event
from tillerman.monitor.codex_wire import (
    Reply,
)

#: A fact's or a record's evidence: what was seen, by name.
Evidence = Mapping[str, EvidenceValue]


@dataclass(frozen=True)
class Dispatch:
    """The policy authorized this intent's mode; ``attempt`` is a fresh unique token."""

    now: float
    attempt: str
    active_turn: str | None = None  # the thread's running turn: the one a queue add waits behind
    active_turn_started_at: float | None = None  # when the ledger saw it start (a following steer)


@dataclass(frozen=True)
class Reconcile:
    """The policy said reconcile (or the daemon restarted): what the ledger knows now.

    ``expected_turn_state`` is the snapshot's state of the expected turn, ``echo_turn_id``
    the turn our clientId echo landed in (``ThreadState.client_ids``) and
    ``echo_turn_state`` that turn's state, ``turn_items`` the items seen starting in the
    expected turn (interrupt: the processes that are ours to end).
    """

    now: float
    expected_turn_state: str | None = None
    echo_turn_id: str | None = None
    turn_items: frozenset[str] = frozenset()
    echo_turn_state: str | None = None  # the state of the echo's turn (an ack token may still be owed)
    behind_turn_state: str | None = None  # queue: the state of the turn the add waits behind
    goal_active: bool = False  # the thread's goal is active (as ``Observed.goal_active``)
    # queue: the stop intent that deleted our message from the server's queue
    # (``ThreadSnapshot.withdrawn``): it can never start a turn.
    withdrawn_by: str | None = None
    # A steer that follows the active turn, waiting after a refusal: the turn running now,
    # when it started, what holds a send now (``tillerman.rules.policy.send_hazard``), and a
    # fresh token for the send's record (None: this fact may not send).
    active_turn: str | None = None
    active_turn_started_at: float | None = None
    held_by: str | None = None
    attempt: str | None = None


@dataclass(frozen=True)
class Replied:
    """The server answered ``command``; ``result`` is its reply as the wire module read it."""

    command: Command
    result: Reply
    now: float


@dataclass(frozen=True)
class Refused:
    """A definite refusal: classified from the server's error, or at tillerman's boundary."""

    command: Command
    refusal: Refusal
    evidence: Evidence
    now: float


@dataclass(frozen=True)
class NoAnswer:
    """Unknown outcome: ``cause`` is timeout, disconnected, unrecognized_error or
    unreadable_reply (a listing that came back without its list)."""

    command: Command
    cause: str
    now: float
    evidence: Evidence = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    event: Event
    now: float
    # The thread's goal is active (the projection's): an interrupt's evidence says the
    # work goes on, a resumed queue's that the goal resumes with it. False leaves both as
    # they were on threads without a goal.
    goal_active: bool = False


@dataclass(frozen=True)
class VerifyDue:
    now: float


@dataclass(frozen=True)
class Verified:
    """The readback's outcome, run in the thread's working directory (read at verify time)."""

    exit_code: int | None  # None: the readback timed out or could not run (no verdict)
    now: float
    cwd_digest: str | None  # None: the thread's working directory is unknown (nothing ran)
    cwd: str | None = None  # the directory itself: only with --retain-payloads
    error: str | None = None  # why it could not run


@dataclass(frozen=True)
class Tick:
    now: float


Fact = Dispatch | Reconcile | Replied | Refused | NoAnswer | Observed | VerifyDue | Verified | Tick
