"""Restart planning: what the daemon must learn and settle before it sends anything new.

A restart (or a reconnect) never resends; it reads back. These functions decide what
to read back and what it means, from the daemon's projection alone (no I/O, no clock):
the daemon issues the requests and hands their answers here.

In the order the daemon uses them when it attaches to a server:

1. ``turns_to_read_back`` — for every open intent whose thread the fold does not know,
   or whose expected turn it still shows running, the thread's turns must be listed
   (``thread/turns/list``): a resume reveals only a turn still in progress, and a thread
   idle when we attached stays unknown to the fold. ``read_back`` turns the listed
   turns asked about into observations (``seen``): the thread exists, those turns ended.
2. ``under_way`` — the intents whose delivery is under way (``dispatch_unknown``,
   ``queued``); each gets its machine's ``Reconcile`` fact (``reconcile_fact``): what the
   ledger knows now of its expected turn, its echo and the turn a queue add waits behind.
3. ``verify_due`` — an acknowledged intent's ``verify`` readback is due once the turn that
   took the message has ended; the machine asks for it itself when it sees that end, and
   this covers a restart after it.

``turn_items`` (the processes an interrupt may end) also seeds a machine rebuilt from
the ledger (``Delivery.from_view``). ``observed`` and ``as_intent_names`` hand a machine
what the sources saw with each turn named as its intent names it: one turn can carry two
sources' ids (``ThreadSnapshot.same_turn``), and the machine compares ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import get_args

import msgspec

from tillerman.controller.core.delivery import ack_turn, behind_turn, target_turn
from tillerman.controller.core.facts import Observed, Reconcile
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope, Event
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.snapshot import ENDED_TURN_STATES, ThreadSnapshot
from tillerman.monitor.codex_wire import Turn
from tillerman.rules.policy import send_hazard

#: Intent states whose delivery is under way: sent or possibly sent, not settled.
UNDER_WAY = frozenset({State.DISPATCH_UNKNOWN, State.QUEUED})


def under_way(projection: Projection) -> list[IntentView]:
    """The open intents a restart must reconcile before anything new is sent."""
    return [view for view in projection.open_intents() if view.state in UNDER_WAY]


def reconcile_fact(projection: Projection, view: IntentView, now: float, attempt: str | None = None) -> Reconcile:
    """What the ledger knows now that settles (or moves on) a delivery under way; for a
    steer that follows the active turn also the turn running now and what holds a send,
    with ``attempt`` (a fresh token) if the driver lets this fact send again."""
    intent = view.intent
    thread = projection.threads.get(intent.thread_id)
    snapshot = projection.snapshot(intent.thread_id)
    echo = thread.client_ids.get(intent.client_user_message_id) if thread else None
    fact = Reconcile(now, snapshot.turn_state(target_turn(view)), as_intent_names(snapshot, intent, echo),
                     turn_items(projection, view),
                     echo_turn_state=snapshot.turn_state(echo),
                     behind_turn_state=snapshot.turn_state(behind_turn(view)),
                     goal_active=snapshot.goal_active, withdrawn_by=snapshot.withdrawn.get(intent.id))
    if not intent.follows_active_turn:
        return fact
    return replace(fact, active_turn=snapshot.active_turn_id, active_turn_started_at=snapshot.active_turn_started_at,
                   held_by=send_hazard(snapshot) or ("other_writer_input" if snapshot.other_writer_input else None),
                   attempt=attempt)


def turn_items(projection: Projection, view: IntentView) -> frozenset[str]:
    """Items still running that started in the intent's expected turn (an interrupt
    may end only these processes)."""
    thread = projection.threads.get(view.intent.thread_id)
    running = thread.running.items() if thread else ()
    snapshot = projection.snapshot(view.intent.thread_id)
    return frozenset(item_id for item_id, item in running
                     if snapshot.same_turn(item.turn_id, view.intent.expected_turn_id))


def as_intent_names(snapshot: ThreadSnapshot, intent: Intent, turn_id: str | None) -> str | None:
    """``turn_id`` as the intent names that turn: its expected turn's own id when the two
    are one turn under two sources' ids (a Claude Code transcript's uuid, its hooks'
    ``prompt_id``), so the delivery machine, which compares ids, sees one turn."""
    if turn_id != intent.expected_turn_id and snapshot.same_turn(turn_id, intent.expected_turn_id):
        return intent.expected_turn_id
    return turn_id


def observed(snapshot: ThreadSnapshot, intent: Intent, event: Event, now: float) -> Observed:
    """An observation for one intent's delivery machine, its turn named as the intent names it."""
    turn_id = as_intent_names(snapshot, intent, event.turn_id)
    return Observed(event if turn_id == event.turn_id else msgspec.structs.replace(event, turn_id=turn_id), now,
                    goal_active=snapshot.goal_active)


def verify_due(projection: Projection, view: IntentView) -> bool:
    """Whether the turn that acknowledged the intent has ended: the agent is done with
    our message, so its effect can be read back."""
    return projection.snapshot(view.intent.thread_id).turn_state(ack_turn(view)) in ENDED_TURN_STATES


def turns_to_read_back(projection: Projection) -> dict[str, set[str]]:
    """Thread id → the expected turns to look for in its listed turns: every thread of an
    open intent that the fold does not know (with no turn, only to record it seen), and
    every thread whose open intent's expected turn the fold still shows running."""
    wanted: dict[str, set[str]] = {}
    for view in projection.open_intents():
        intent = view.intent
        snapshot = projection.snapshot(intent.thread_id)
        if not snapshot.known:
            wanted.setdefault(intent.thread_id, set())
        turn = target_turn(view)
        if turn is not None and snapshot.turn_state(turn) not in ENDED_TURN_STATES:
            wanted.setdefault(intent.thread_id, set()).add(turn)
    return wanted


def read_back(projection: Projection, thread_id: str, turns: Iterable[Turn], wanted: set[str],
              source: str) -> list[Envelope]:
    """What a readback of the thread's turns (``thread/turns/list``) shows of the turns
    asked about (``turns_to_read_back``), as ``seen`` records it."""
    return seen(projection, thread_id, [t for t in turns if t.id in wanted], source)


def seen(projection: Projection, thread_id: str, turns: Iterable[Turn], source: str) -> list[Envelope]:
    """What a resume or a readback shows that notifications may not have: the thread
    exists (a thread idle when we attached is otherwise unknown to the fold), and which
    listed turns have ended (a resume reveals only a running turn). Only what the fold
    does not know yet; no time stamp, so recording it twice is a silent no-op. The
    listing is one read again past a turn that was just starting (``settled_listing``)."""
    snapshot = projection.snapshot(thread_id)
    out = [] if snapshot.known else [Envelope(
        event_id=f"rb-thread-seen:{thread_id}", source=source, at=None,
        event=ev.ThreadStarted(thread_id=thread_id, source_format="appserver"))]
    for turn in turns:
        turn_id, status = turn.id, turn.status
        if turn_id is not None and status in get_args(ev.TurnStatus) \
                and snapshot.turn_state(turn_id) not in ENDED_TURN_STATES:
            out.append(Envelope(event_id=f"rb-turn-ended:{thread_id}:{turn_id}:{status}", source=source,
                                at=None, event=ev.TurnCompleted(thread_id=thread_id, turn_id=turn_id, status=status)))
    return out
