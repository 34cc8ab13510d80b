"""The driver loop of the delivery protocol: a machine, the ledger and the adapter joined.

The delivery machine (``tillerman.controller.core.delivery``) decides, the guarded adapter
(``tillerman.controller.dispatch.adapter``) sends; ``carry_out`` runs the loop between them the
way ``Output.durable`` asks: every output's envelopes are appended (fsynced when they
are a dispatch record) BEFORE its commands are executed, and each command's outcome is
fed back as the next fact. A boundary refusal becomes the machine's ``Refused`` fact.

The protocol's crash points are named here (``CHECKPOINTS``), in protocol order, and a
process may be made to die at one of them (``TILLERMAN_KILL_AT``, ``kill_at``), or to
stop there as a paused process would (``TILLERMAN_STOP_AT``: SIGSTOP, until a SIGCONT):
the daemon passes that hook, the fault tests set the variables.

Several daemons on one database: a delivery carries its thread's ``Fence``
(``tillerman.controller.dispatch.leases_keeper``). Its dispatch record is appended only while the
lease is current (checked in the append's transaction), and the lease is checked again
just before a dispatch command goes to the transport; either check failing raises
``Fenced`` with nothing sent. The window left: a daemon stopped between that re-check
and the write to the socket sends once after its lease lapsed (see README, "PostgreSQL
and several daemons").
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from tillerman.controller.core.boundary import BoundaryRefusal
from tillerman.controller.core.commands import DISPATCH_COMMANDS
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Fact, Replied
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.ledger.errors import Fenced
from tillerman.ledger.recorder import Recorder

if TYPE_CHECKING:
    from tillerman.controller.dispatch.leases_keeper import Fence

#: Named points of the dispatch protocol where a fault test may kill the daemon, in
#: protocol order (every dispatch mode passes each of them once):
#: ``dispatch_recording`` — the dispatch record is built, not yet written;
#: ``dispatch_recorded`` — the durable ``dispatch_unknown`` record is committed, nothing sent;
#: ``dispatch_sending`` — the boundary is about to send the steer, queue add or interrupt
#: (queue: after the list that precedes the add was answered);
#: ``dispatch_answered`` — the server accepted it, the answer is not yet recorded;
#: ``answer_recorded`` — the answer (or, echo first, the late-reply evidence) is committed.
CHECKPOINTS = ("dispatch_recording", "dispatch_recorded", "dispatch_sending", "dispatch_answered",
               "answer_recorded")

#: ``TILLERMAN_KILL_AT=<one of CHECKPOINTS>``: the process SIGKILLs itself there (``kill_at``).
KILL_AT_ENV = "TILLERMAN_KILL_AT"
#: ``TILLERMAN_STOP_AT=<one of CHECKPOINTS>``: the process SIGSTOPs itself there, the first time only.
STOP_AT_ENV = "TILLERMAN_STOP_AT"
_stopped: set[str] = set()


class StaleDelivery(Exception):
    """The ledger already holds a different record of this move: another machine made it.
    Rebuild the machine from the ledger (``Delivery.from_view``) and carry on from there."""


def kill_at(point: str) -> None:
    """Fault injection: die at ``point`` as a crash would, when ``TILLERMAN_KILL_AT`` names
    it; stop there (once) as a paused process would, when ``TILLERMAN_STOP_AT`` does."""
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_AT_ENV) == point and point not in _stopped:
        _stopped.add(point)
        os.kill(os.getpid(), signal.SIGSTOP)


async def carry_out(
    machine: Delivery, fact: Fact, recorder: Recorder, adapter: GuardedAdapter,
    checkpoint: Callable[[str], None] = lambda point: None, fence: Fence | None = None,
) -> None:
    """Feed one fact and everything it leads to: append each output (fsynced when it is a
    dispatch record) BEFORE executing its commands, then feed back their outcomes.

    ``checkpoint`` is called at each of ``CHECKPOINTS`` (a fault test kills the process
    there): around the durable dispatch record, just before a dispatch command goes to
    the transport, after the server accepted it, and after that answer is recorded.

    ``fence``: the thread's lease (several daemons on one database): the dispatch record
    is appended only while it is current, and it is checked again just before a dispatch
    command is sent.

    Raises ``IllegalTransition`` or ``StaleDelivery`` when another writer moved the intent
    first, ``Fenced`` when the lease is no longer current; nothing of the refused output
    was sent.
    """
    pending: list[Fact] = [fact]
    while pending:
        current = pending.pop(0)
        output = machine.handle(current)
        answered = isinstance(current, Replied) and isinstance(current.command, DISPATCH_COMMANDS)
        if output.envelopes:
            if output.durable:
                checkpoint("dispatch_recording")
            # Off the event loop where the recorder can (the daemon's ``GatedRecorder``), so
            # that its flush stops nothing else the loop does.
            if output.durable and fence is not None:
                appended = await recorder.append_off_loop(output.envelopes, durable=True, fence=fence.lease)
            else:
                appended = await recorder.append_off_loop(output.envelopes, durable=output.durable)
            if appended.conflicts:
                raise StaleDelivery(f"intent {machine.intent.id}: the ledger holds another {appended.conflicts[0]}")
            if output.durable:
                checkpoint("dispatch_recorded")
        if answered:
            checkpoint("answer_recorded")
        for command in output.commands:
            if isinstance(command, DISPATCH_COMMANDS):
                checkpoint("dispatch_sending")
                if fence is not None and not fence.still_held():  # the last check before the socket
                    raise Fenced(f"intent {machine.intent.id}: the lease on thread {fence.lease.thread_id}"
                                 f" (token {fence.lease.token}) lapsed before the send: nothing sent")
            try:
                outcome = await adapter.execute(command)
            except BoundaryRefusal as refusal:
                outcome = refusal.as_fact(command, adapter.clock())
            if isinstance(command, DISPATCH_COMMANDS) and isinstance(outcome, Replied):
                checkpoint("dispatch_answered")
            pending.append(outcome)
