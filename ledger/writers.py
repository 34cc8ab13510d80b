"""Several writers on one thread: who opened each turn or sent each message (when the
wire says), and what Codex did with two writers' input (docs/goals.md "Several writers").

Codex assumes one client per thread; a TUI, an IDE, a harness and tillerman may all
write to one server's thread. The wire names a message's writer only by its ``clientId``:
ours is ``tillerman-in-…`` (``Intent.client_user_message_id``); any other, or none, is
another writer's. The fold (``tillerman.ledger.projections``) keeps, from what an
app-server connection saw (a rollout or a hook names no writer):

* ``ThreadState.turn_writers``: who opened each recent turn with a user message (a goal's
  continuation, or a queued message we did not send, is not ours either way); pruned with
  the turn table;
* ``ThreadState.other_input``: another writer's message folded into the running turn (a
  ``turn/start`` or ``turn/steer`` that came after the turn's first input) that no agent
  message has answered yet: the policy holds tillerman's own steer and queue meanwhile
  (``ThreadSnapshot.other_writer_input``), so two writers' instructions are not
  interleaved in one turn without a recorded reason;
* ``ThreadState.writer_facts``: the latest ``WRITER_FACTS`` facts a person sees in
  ``tillerman status``: ``overlapping_turn`` (a turn started while another was still
  running on the thread) and ``input_folded`` (another writer's message folded into a
  running turn).
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from tillerman.ledger import events as ev
from tillerman.ledger.intents import client_id_to_intent_id

TILLERMAN, OTHER = "tillerman", "other"
WRITER_FACTS = 16  # the latest facts a thread keeps
#: The turn's first input was no user message (a goal's continuation starts with the model).
MODEL_FIRST = ""


class WriterFact(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "overlapping_turn" | "input_folded"
    turn_id: str
    other_turn_id: str | None = None  # overlapping_turn: the turn that was still running
    item_id: str | None = None  # input_folded: the other writer's message
    at: float | None = None


class ThreadState(Protocol):
    """What of a thread's fold these functions read and keep
    (``tillerman.ledger.projections.ThreadState``; named here, not imported, so the
    fold depends on this module and not the reverse)."""

    active_turn_id: str | None
    turn_input: str | None
    other_input: str | None
    turn_writers: dict[str, str]
    writer_facts: tuple[WriterFact, ...]

    def canonical_turn(self, turn_id: str | None) -> str | None: ...


def writer_of(client_id: str | None) -> str:
    """``tillerman`` for our clientId, ``other`` for anyone else's (or none)."""
    return TILLERMAN if client_id_to_intent_id(client_id) else OTHER


def _live(source: str) -> bool:
    return source.startswith("appserver")


def turn_started(t: ThreadState, turn: str, at: float | None, source: str) -> None:
    """Before ``turn`` becomes the thread's running turn: a turn still running is a fact."""
    if _live(source) and t.active_turn_id is not None and t.active_turn_id != turn:
        _note(t, WriterFact(kind="overlapping_turn", turn_id=turn, other_turn_id=t.active_turn_id, at=at))
    t.turn_input, t.other_input = None, None


def turn_ended(t: ThreadState) -> None:
    t.turn_input, t.other_input = None, None


def user_message(t: ThreadState, e: ev.UserMessage, at: float | None, source: str) -> str | None:
    """The running turn's first user message names who opened it; another writer's that
    came after its first input was folded in (a fact, and a hold until answered).
    Returns the writer this message opened the running turn for (None: it opened none)."""
    turn = t.canonical_turn(e.turn_id)
    if not _live(source) or turn is None or turn != t.active_turn_id:
        return None
    if t.turn_input is None:
        t.turn_input = e.item_id or MODEL_FIRST
        return t.turn_writers.setdefault(turn, writer_of(e.client_id))
    if writer_of(e.client_id) == TILLERMAN or e.item_id in (t.turn_input, t.other_input):
        return None  # our own steer, or a second copy of a message already seen
    t.other_input = e.item_id or MODEL_FIRST
    if e.item_id is None or all(f.item_id != e.item_id for f in t.writer_facts):
        _note(t, WriterFact(kind="input_folded", turn_id=turn, item_id=e.item_id, at=at))
    return None


def model_output(t: ThreadState, e: ev.Event, source: str) -> None:
    """The model worked in the running turn: before any user message, the turn opened with
    none (a continuation); an agent message answers the input folded in before it."""
    if not _live(source) or t.canonical_turn(e.turn_id) != t.active_turn_id or t.active_turn_id is None:
        return
    if isinstance(e, ev.ItemStarted) and e.item_type == "userMessage":
        return
    if t.turn_input is None:
        t.turn_input = MODEL_FIRST
    if isinstance(e, ev.AgentMessage):
        t.other_input = None


def _note(t: ThreadState, fact: WriterFact) -> None:
    t.writer_facts = (*t.writer_facts, fact)[-WRITER_FACTS:]
