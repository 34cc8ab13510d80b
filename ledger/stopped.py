"""A stopped thread stays stopped (docs/goals.md "Stopping a thread"): which stop stopped
a thread, what resumes it, and which of tillerman's queued messages a stop withdrew.

A stop's effect is "this thread does no more work until a person resumes it". Its
machine (``tillerman.controller.core.stop``) ends the work on the server; the fold
(``tillerman.ledger.projections``) keeps, per thread:

* ``ThreadState.stopped_by``: the stop intent, once it is ``acknowledged`` (its steps
  carried out) or ``effect_verified``, until a person resumes the thread. Meanwhile the
  policy holds every steer, queue and interrupt a rule or a reviewer produced
  (``thread_stopped``): a rule's later message would start work again. What resumes it,
  each a person's act (``resumed_*`` below): a turn opened by another writer's message
  (a TUI, an IDE: ``tillerman.ledger.writers``), the goal set active again by someone
  other than tillerman, or tillerman sending a person's own steer or queued message.
  Only what an app-server connection saw counts: a rollout read late may hold a goal or a
  turn from before the stop.
* ``ThreadState.withdrawn``: each of tillerman's queued messages a stop deleted from the
  server's queue (``queue_withdrawn`` evidence with ``deleted: true``), by its queue
  intent, naming the stop; the policy has that intent's machine settle it ``expired
  withdrawn`` (it can never start a turn), and the entry goes when the intent settles.
"""

from __future__ import annotations

from typing import Protocol

from tillerman.ledger.intent_states import State, is_terminal
from tillerman.ledger.intents import Intent
from tillerman.ledger.snapshot import GOAL_ACTIVE
from tillerman.ledger.writers import OTHER, TILLERMAN

#: The producer of a person's intent (``owner:NAME``); a rule's is ``rule:ID``, a
#: reviewer's ``reviewer:NAME``.
PERSON_PREFIX = "owner:"
#: A person's intents of these modes give the agent work: sending one resumes the thread.
RESUMING_MODES = frozenset({"steer", "queue"})
#: The modes a stopped thread holds when a rule or a reviewer produced them.
HELD_MODES = frozenset({"steer", "queue", "interrupt"})
#: A stop's states in which its steps were carried out: the thread is stopped.
_STOPPED = frozenset({State.ACKNOWLEDGED, State.EFFECT_VERIFIED})
#: The evidence a stop records for each of our queued messages it deleted.
WITHDRAWN_EVIDENCE = "queue_withdrawn"


class ThreadState(Protocol):
    """What of a thread's fold these functions keep (``tillerman.ledger.projections.ThreadState``)."""

    stopped_by: str | None
    withdrawn: dict[str, str]


def from_person(intent: Intent) -> bool:
    """Whether a person proposed the intent (not a rule, not a reviewer)."""
    return intent.producer.startswith(PERSON_PREFIX)


def held_while_stopped(intent: Intent) -> bool:
    """Whether a stopped thread holds this intent: a rule's or a reviewer's steer, queue or
    interrupt. A person's goes through (a steer or queue of theirs resumes the thread)."""
    return intent.mode in HELD_MODES and not from_person(intent)


def intent_moved(t: ThreadState, intent: Intent, state: State) -> None:
    """An intent on the thread reached ``state``: a stop whose steps were carried out
    stops the thread; a person's steer or queue being sent resumes it; a settled queue
    intent leaves ``withdrawn``."""
    if intent.mode == "stop" and state in _STOPPED:
        t.stopped_by = intent.id
    elif state is State.DISPATCH_UNKNOWN and intent.mode in RESUMING_MODES and from_person(intent):
        t.stopped_by = None
    if t.withdrawn and is_terminal(state, intent):
        t.withdrawn.pop(intent.id, None)


def queue_withdrawn(t: ThreadState, queue_intent_id: str, stop_intent_id: str) -> None:
    """A stop deleted the queue intent's message from the server's queue."""
    t.withdrawn[queue_intent_id] = stop_intent_id


def resumed_by_turn(t: ThreadState, opener: str | None) -> None:
    """A live user message opened the running turn, written by ``opener``
    (``tillerman.ledger.writers.user_message``; None: it opened no turn)."""
    if opener == OTHER:
        t.stopped_by = None


def resumed_by_goal(t: ThreadState, old_status: str | None, status: str, by: str | None, live: bool,
                    turn_id: str | None) -> None:
    """The goal set active (a ``thread/goal/set``: its report names no turn), seen by an
    app-server connection (``live``), and not by tillerman (a stop only ever pauses a
    goal). A report at a turn's end says how the goal stood when that turn ended: the
    turn the stop interrupted may report it active after the pause."""
    if live and turn_id is None and status == GOAL_ACTIVE and old_status != GOAL_ACTIVE and by != TILLERMAN:
        t.stopped_by = None
