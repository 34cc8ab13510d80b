"""App-server error responses → typed refusals: the one place that reads their text.

The real app-server (every release in ``CHECKED_CODEX_VERSIONS``) answers every
refusal with JSON-RPC code -32600 and a fixed English message (reference/codex-app-server.md §2 "Error semantics", §3, §4,
A4), so the message is the only thing that says what went wrong. Each known message
is matched by an anchored regex, never by a substring, so a new message that merely
contains an old one is not mistaken for it; turn ids are pulled out as evidence.

What an error means for delivery
--------------------------------
A *recognized* refusal is definite: the server validated the request and refused it
before doing anything (a failed steer has no items and reaches no model), so the
intent can be rejected at once. A stale-turn refusal is final for its intent: the
``found`` turn id is evidence for a person, never a target to retry against.

An *unrecognized* error (``refusal is None``) is NOT treated as a refusal. A newer
server, an internal error or a failure after the request was partly carried out
cannot be told apart from its text, so the delivery stays ``dispatch_unknown`` and
is settled the same way as a timeout: by the echo, or by a readback once the
expected turn has ended. That costs a wait, never a duplicate: nothing is resent.
The one exception is a message of the form ``Invalid request: …``: the server failed
to deserialize the request, so no handler ever ran.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from tillerman.monitor.jsonrpc import RpcError

EvidenceValue = str | int | float | bool | None

# The releases whose exact refusal messages the patterns below were checked against, live,
# oldest first: `make compat` runs tests/live against the first and the last, the live
# tests run the last by default (docs/operations/upgrading-codex.md). `tillerman status`
# warns about a server that is not one of them.
CHECKED_CODEX_VERSIONS = ("0.153.4", "0.163.0", "0.171.0")


class Refusal(StrEnum):
    """Why the server refused a request; each is a reason for dispatch_unknown → rejected."""

    STALE_TURN = "stale_turn"  # the expected turn is not the active one
    NO_ACTIVE_TURN = "no_active_turn"
    THREAD_NOT_FOUND = "thread_not_found"
    INVALID_INPUT = "invalid_input"
    QUEUE_BUSY = "queue_busy"  # the thread already runs (or is about to run) a turn
    REFUSED = "refused"  # any other definite refusal (also: refused at tillerman's own boundary)


@dataclass(frozen=True)
class ClassifiedError:
    """An error response read: ``refusal`` is None when the message is not recognized."""

    refusal: Refusal | None
    code: int
    message: str
    evidence: dict[str, EvidenceValue] = field(default_factory=dict)

    @property
    def definite(self) -> bool:
        return self.refusal is not None


# (anchored pattern, refusal); named groups become evidence. Order matters: the steer
# form (with backticks) is tried before the interrupt form (without), whose ``\S+``
# would otherwise swallow the backticks. "thread not loaded", "queue is empty" and the
# "Invalid request" form were observed on 0.163.0 too (thread/turns/list, queue/start).
_PATTERNS: tuple[tuple[re.Pattern[str], Refusal], ...] = (
    (re.compile(r"expected active turn id `(?P<expected_turn_id>[^`]*)` but found `(?P<found_turn_id>[^`]*)`"),
     Refusal.STALE_TURN),
    (re.compile(r"expected active turn id (?P<expected_turn_id>\S+) but found (?P<found_turn_id>\S+)"),
     Refusal.STALE_TURN),
    (re.compile(r"no active turn to (?P<operation>steer|interrupt)"), Refusal.NO_ACTIVE_TURN),
    (re.compile(r"thread not found: (?P<thread_id>\S+)"), Refusal.THREAD_NOT_FOUND),
    (re.compile(r"thread not loaded: (?P<thread_id>\S+)"), Refusal.THREAD_NOT_FOUND),
    (re.compile(r"input must not be empty"), Refusal.INVALID_INPUT),
    (re.compile(r"thread already has an active or pending turn"), Refusal.QUEUE_BUSY),
    (re.compile(r"queued submission not found: (?P<queued_submission_id>\S+)"), Refusal.REFUSED),
    (re.compile(r"queue is empty"), Refusal.REFUSED),
    (re.compile(r"queue reorder must include every queued submission exactly once"), Refusal.INVALID_INPUT),
    # thread/goal/set on a thread without a goal (0.171.0): a stop finds nothing to pause
    (re.compile(r"cannot update goal for thread (?P<thread_id>\S+): no goal exists"), Refusal.REFUSED),
    # serde could not read the request (unknown method or variant, missing field): no handler ran
    (re.compile(r"Invalid request: (?P<detail>.+)", re.DOTALL), Refusal.REFUSED),
)


def classify(error: RpcError) -> ClassifiedError:
    """Read one error response; see the module docstring for what ``refusal=None`` means."""
    evidence: dict[str, EvidenceValue] = {"code": error.code, "message": error.message}
    for pattern, refusal in _PATTERNS:
        match = pattern.fullmatch(error.message)
        if match is not None:
            return ClassifiedError(refusal, error.code, error.message, evidence | match.groupdict())
    return ClassifiedError(None, error.code, error.message, evidence)
