"""A Claude Code hook claims a decided intent before it delivers it: the same durable
``proposed → dispatch_unknown`` record (reason ``dispatching``, with an ``attempt`` token)
the delivery machine writes before the guarded adapter sends to the app-server
(``tillerman.controller.core.delivery``). The ledger's state table makes the claim exactly
once: a second hook (another stop of the same chain, a hook racing it) finds the intent
moved and delivers nothing; so does a hook whose intent was cancelled meanwhile.

Imported by the hook only when its session's outbox holds an intent for the point it
runs at, so an ordinary hook event never loads the ledger. The ledger may be busy (a
long write transaction elsewhere): the claim waits at most ``CLAIM_BUSY_MS``, then
gives up, and the hook answers nothing (fails open for the agent).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from tillerman.controller.core.intent_requests import intent_view, transition_envelope
from tillerman.ledger.errors import IllegalTransition, LedgerError
from tillerman.ledger.intent_states import State
from tillerman.ledger.paths import check_ledger_path
from tillerman.ledger.sqlite import SQLiteRecorder

#: How long a claim may wait for a busy ledger: well inside the hook's own time limit
#: (``tillerman.controller.claude.settings.TIMEOUT_SECONDS``).
CLAIM_BUSY_MS = 2_000
VIA = "claude-hook"  # the claim's evidence names the transport


@dataclass(frozen=True)
class Claim:
    claimed: bool
    why: str  # "claimed", or why not: "moved:<state>", "ledger_busy", "ledger_error", ...
    attempt: str | None = None


def claim(ledger: str, intent_id: str, *, event: str, turn_id: str | None,
          busy_timeout_ms: int = CLAIM_BUSY_MS) -> Claim:
    """Record the claim of ``intent_id`` (fsynced) before the hook prints its decision."""
    try:
        # The outbox names the ledger; whatever wrote it, the hook opens only an existing ledger
        # (never creates one) and never a ledger's companion file, a FIFO or a device.
        if not os.path.isfile(check_ledger_path(ledger).path):
            return Claim(False, "ledger_error: no ledger at the path the outbox names")
        with SQLiteRecorder(ledger, busy_timeout_ms=busy_timeout_ms) as recorder:
            view = intent_view(recorder, intent_id)
            if view.state is not State.PROPOSED:
                return Claim(False, f"moved:{view.state}")
            attempt = uuid.uuid4().hex
            evidence = {"attempt": attempt, "mode": view.intent.mode, "via": VIA, "hook_event": event,
                        "turn_id": turn_id}
            envelope = transition_envelope(view.intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching",
                                           evidence, time.time())
            result = recorder.append([envelope], durable=True)
            if result.conflicts:
                return Claim(False, "moved:dispatch_unknown")  # another hook claimed it first
            return Claim(True, "claimed", attempt)
    except IllegalTransition:
        return Claim(False, "moved")
    except LedgerError as exc:
        return Claim(False, "ledger_busy" if "busy" in str(exc) else f"ledger_error: {exc}")
