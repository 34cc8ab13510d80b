"""What a delivery machine asks the adapter to do, and what it returns.

A machine (``tillerman.controller.core.delivery``, ``tillerman.controller.core.stop``)
answers each fact with an ``Output``: ledger envelopes to append, then these commands for
the adapter (``tillerman.controller.dispatch.adapter``) to carry out, in that order. Each
command names its intent and thread; the adapter's boundary checks a write against the
intent's durable dispatch record before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from tillerman.ledger.events import Envelope


@dataclass(frozen=True, kw_only=True)
class Command:
    intent_id: str
    thread_id: str


@dataclass(frozen=True, kw_only=True)
class Steer(Command):
    expected_turn_id: str
    client_user_message_id: str
    text: str
    attempt: str  # the dispatch record this send belongs to


@dataclass(frozen=True, kw_only=True)
class QueueAdd(Command):
    client_user_message_id: str
    text: str
    attempt: str


@dataclass(frozen=True, kw_only=True)
class Interrupt(Command):
    turn_id: str
    attempt: str


@dataclass(frozen=True, kw_only=True)
class PauseGoal(Command):
    """A stop's first change: pause the thread's goal (``tillerman.controller.core.stop``)."""

    origin: str  # "user" for a person's stop, "automatic" for a rule's
    attempt: str


@dataclass(frozen=True, kw_only=True)
class QueueDelete(Command):
    """A stop withdraws one of tillerman's own queued messages."""

    submission_id: str
    withdrawn_intent_id: str  # the queue intent the message belongs to
    attempt: str


#: The commands that deliver something; the adapter sends them only under their record.
DISPATCH_COMMANDS = (Steer, QueueAdd, Interrupt, PauseGoal, QueueDelete)


@dataclass(frozen=True, kw_only=True)
class QueueList(Command):
    pass


@dataclass(frozen=True, kw_only=True)
class ReadGoal(Command):
    """``thread/goal/get``: a stop reads the goal before it pauses it, and after, to verify."""

    verifying: bool = False
    not_before: float = 0.0  # the adapter sends it no earlier (a stop's settled readback)


@dataclass(frozen=True, kw_only=True)
class ReadTurns(Command):
    """A stop's look at the thread's newest turns: is one running?"""

    verifying: bool = False
    not_before: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ReadBack(Command):
    """Look for our clientId in the thread's history: in ``turn_id``, or in any recent turn."""

    client_id: str
    turn_id: str | None
    cursor: str | None = None


@dataclass(frozen=True, kw_only=True)
class ListTerminals(Command):
    pass


@dataclass(frozen=True, kw_only=True)
class Terminate(Command):
    process_id: str
    item_id: str
    turn_id: str  # the interrupted turn the item started in


@dataclass(frozen=True, kw_only=True)
class ResumeQueue(Command):
    pass


@dataclass(frozen=True, kw_only=True)
class RunVerify(Command):
    command: str


@dataclass(frozen=True)
class Output:
    envelopes: tuple[Envelope, ...] = ()
    commands: tuple[Command, ...] = ()
    durable: bool = False  # append with a full fsync BEFORE executing the commands
