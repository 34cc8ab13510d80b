"""Intents on request: building, proposing, cancelling and moving them through the
ledger's state table (the intent record and its table are ``tillerman.ledger.intents``
and ``tillerman.ledger.intent_states``).

These functions are the library behind ``tillerman intent …``; the daemon's delivery
machine drives the same ``transition``. Every change is one ledger append; the ledger
itself refuses a move outside the table, so a race between two writers (the daemon
settling an intent while a person cancels it) leaves exactly one winner on record.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from tillerman.controller.core.printable import printable
from tillerman.controller.core.timefmt import check_time
from tillerman.ledger import projections
from tillerman.ledger.errors import IllegalTransition, UnknownIntent
from tillerman.ledger.events import Envelope, IntentEvidence, IntentProposed, IntentTransition
from tillerman.ledger.intent_states import State, check_transition
from tillerman.ledger.intents import DELIVERY_POINTS, MODES, Intent, intent_id_from, text_digest
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.recorder import Recorder
from tillerman.rules.durations import check_duration

DEFAULT_ACK_DEADLINE = 120.0
DEFAULT_EFFECT_DEADLINE = 600.0
DEFAULT_EXPIRES = 1800.0
SOURCE = "tillerman"  # the source of every record tillerman makes itself (not an observation)


class IntentError(ValueError):
    """A request that cannot become an intent, with what to do instead."""


def build_intent(
    projection: Projection,
    *,
    thread_id: str,
    mode: str,
    text: str,
    now: float,
    expected_turn: str | None = None,
    ack_deadline: float = DEFAULT_ACK_DEADLINE,
    effect_deadline: float | None = None,
    expires: float = DEFAULT_EXPIRES,
    expect: str | None = None,
    verify: str | None = None,
    supersedes: str | None = None,
    owner: str | None = None,
    producer: str | None = None,
    intent_id: str | None = None,
    ack_token: str | None = None,
    force: bool = False,
    resume_queue: bool = False,
    task_class: str | None = None,
    deliver_at: str | None = None,
    cancel_queued: bool = False,
    **fields,
) -> Intent:
    """Validate a request completely and bind it to its target; ``expected_turn='active'``
    resolves to the turn active now and records it (a steer also records that it follows
    the active turn: ``Intent.follows_active``). Every value is checked here, before
    anything is written: an intent is one append, and a bad row in an append-only ledger
    is there forever."""
    if mode not in MODES:
        raise IntentError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not isinstance(text, str) or not text.strip():
        raise IntentError("the intent text is empty; say precisely what should change")
    _check_names(thread=thread_id, expected_turn=expected_turn, owner=owner, producer=producer,
                 supersedes=supersedes, expect=expect, verify=verify, intent_id=intent_id, task_class=task_class)
    try:
        check_time(now, "the time of the proposal")
        ack_deadline = check_duration(ack_deadline, "--ack-deadline")
        expires = check_duration(expires, "--expires")
        if effect_deadline is not None:
            effect_deadline = check_duration(effect_deadline, "--effect-deadline")
    except ValueError as exc:
        raise IntentError(str(exc)) from None
    _check_mode_options(mode, ack_token=ack_token, force=force, resume_queue=resume_queue)
    _check_stop_options(mode, expected_turn=expected_turn, expect=expect, verify=verify)
    _check_transport_options(mode, deliver_at=deliver_at, cancel_queued=cancel_queued, resume_queue=resume_queue)
    if mode in ("steer", "interrupt") and not expected_turn:
        raise IntentError(f"a {mode} needs --expected-turn (a turn id, or 'active')")
    if expected_turn == "active":
        snapshot = projection.snapshot(thread_id)
        expected_turn = snapshot.active_turn_id
        # A steer for the thread's current work follows it from turn to turn (docs/goals.md
        # "Steering a moving target"); between two turns of a thread whose goal keeps it
        # busy it waits for the next turn instead of failing.
        follows = mode == "steer" and deliver_at is None
        if follows:
            fields["follows_active"] = True
        if expected_turn is None and not (follows and snapshot.goal_active):
            raise IntentError(
                f"thread {thread_id} has no active turn in the ledger; give a turn id, or use --mode queue"
            )
    if supersedes is not None and supersedes not in projection.intents:
        raise IntentError(f"--supersedes names no known intent: {supersedes}")
    has_check = expect is not None or verify is not None or mode == "stop"  # as Intent.has_check
    if effect_deadline is None and has_check:
        effect_deadline = DEFAULT_EFFECT_DEADLINE
    producer = producer or f"owner:{owner or 'unknown'}"
    if task_class is not None:
        fields["task_class"] = task_class  # absent otherwise: the record keeps its old bytes
    if deliver_at is not None:
        fields["deliver_at"] = deliver_at  # likewise
    if cancel_queued:
        fields["cancel_queued"] = True  # likewise
    return Intent(
        id=intent_id or intent_id_from(thread_id, expected_turn, mode, text, now, os.urandom(8).hex()),
        thread_id=thread_id, mode=mode, text=text, text_digest=text_digest(text),
        created_at=now, ack_deadline=now + ack_deadline, expires_at=now + expires,
        expected_turn_id=expected_turn,
        effect_deadline=None if effect_deadline is None else now + effect_deadline,
        owner=owner, producer=producer, expect=expect, verify=verify, supersedes=supersedes,
        ack_token=ack_token, force=force, resume_queue=resume_queue, **fields,
    )


def _check_names(**values: str | None) -> None:
    """Ids and texts given as options: absent, or one line that is not blank (an empty
    thread id names no thread; an empty command or predicate checks nothing)."""
    for name, value in values.items():
        if value is None:
            continue
        option = "--" + name.replace("_", "-")
        if not isinstance(value, str) or not value.strip():
            raise IntentError(f"{option} is empty; give a value or leave the option out")
        if name != "verify" and ("\n" in value or "\r" in value or "\x00" in value):
            raise IntentError(f"{option} must be one line")
        if "\x00" in value:
            raise IntentError(f"{option} contains a NUL character")


def _check_mode_options(mode: str, *, ack_token: str | None, force: bool, resume_queue: bool) -> None:
    """The options that belong to one mode only: an interrupt ends a turn (it may be
    forced through a critical tool, and it pauses the server's queue); a steer or a
    queued message is what an agent can acknowledge with a token."""
    if force and mode not in ("interrupt", "stop"):
        raise IntentError(f"--force applies to --mode interrupt or stop only (a {mode} never ends a critical tool)")
    if resume_queue and mode != "interrupt":
        raise IntentError(f"--resume-queue applies to --mode interrupt only (a {mode} does not pause the queue)")
    if ack_token is None:
        return
    if mode in ("interrupt", "stop"):
        raise IntentError(f"--ack-token applies to --mode steer or queue (a {mode} sends no message to answer)")
    if not ack_token.strip() or "\n" in ack_token:
        raise IntentError("--ack-token must be one line of text the agent will say, e.g. ACK-42")


def _check_stop_options(mode: str, *, expected_turn: str | None, expect: str | None, verify: str | None) -> None:
    """A stop targets the thread, whichever turn runs when it is carried out, and checks
    its own effect (no turn running, the goal not active) by reading the server back."""
    if mode != "stop":
        return
    if expected_turn is not None:
        raise IntentError("--expected-turn does not apply to --mode stop (a stop targets the thread: whatever"
                          " turn runs when it is carried out is interrupted)")
    if expect is not None or verify is not None:
        raise IntentError("--expect and --verify do not apply to --mode stop (its effect is read back from the"
                          " server: no turn running, the goal not active)")


def _check_transport_options(mode: str, *, deliver_at: str | None, cancel_queued: bool,
                             resume_queue: bool) -> None:
    """A steer that waits for the agent's next tool call (Claude Code's PreToolUse hook);
    an interrupt that drops what is queued behind the turn."""
    if deliver_at is not None and deliver_at not in DELIVERY_POINTS:
        raise IntentError(f"--deliver-at must be one of {', '.join(DELIVERY_POINTS)}, not {deliver_at!r}")
    if deliver_at is not None and mode != "steer":
        raise IntentError(f"--deliver-at applies to --mode steer only (a {mode} is not delivered before a tool call)")
    if cancel_queued and mode != "interrupt":
        raise IntentError(f"--cancel-queued applies to --mode interrupt only (a {mode} ends no turn)")
    if cancel_queued and resume_queue:
        raise IntentError("--cancel-queued drops the queued messages that --resume-queue would resume: give one")


def proposal_envelopes(intent: Intent, projection: Projection) -> list[Envelope]:
    """The creation record, plus the expiry of the intent it supersedes (when still
    proposed: a replacement never races the original's delivery)."""
    batch = [_envelope(f"{intent.id}:proposed", IntentProposed(
        thread_id=intent.thread_id, turn_id=intent.expected_turn_id, intent=intent), intent.created_at)]
    old = projection.intents.get(intent.supersedes) if intent.supersedes else None
    if old is not None and old.state == State.PROPOSED:
        batch.append(transition_envelope(old.intent, State.PROPOSED, State.EXPIRED, "superseded",
                                         {"by": intent.id}, intent.created_at))
    return batch


def propose(recorder: Recorder, now: float | None = None, **request) -> Intent:
    now = time.time() if now is None else now
    projection = _what_a_proposal_reads(recorder, request)
    intent = build_intent(projection, now=now, **request)
    recorder.append(proposal_envelopes(intent, projection), durable=True)
    return intent


def _what_a_proposal_reads(recorder: Recorder, request: dict) -> Projection:
    """The ledger's state a proposal needs, and no more: the whole fold only to resolve
    ``expected_turn='active'`` (the thread's running turn); an intent it supersedes from
    that intent's own rows (an indexed lookup); otherwise nothing. A proposal that names
    its turn is one append however many rows the daemon wrote since its last saved fold
    (beside a daemon busy with 200 threads, folding them took a quarter of a core)."""
    if request.get("expected_turn") == "active":
        return projections.load(recorder)
    projection = Projection()
    if (superseded := request.get("supersedes")) is not None:
        projection.fold(recorder.intent_entries(superseded))
    return projection


def transition_envelope(
    intent: Intent, from_state: State, to_state: State, reason: str,
    evidence: Mapping[str, object] | None = None, at: float | None = None,
) -> Envelope:
    event = IntentTransition(
        thread_id=intent.thread_id, turn_id=intent.expected_turn_id, intent_id=intent.id,
        from_state=from_state, to_state=to_state, reason=reason, evidence=dict(evidence or {}),
    )
    return _envelope(f"{intent.id}:{from_state}>{to_state}", event, at)


def evidence_envelope(
    intent: Intent, state: State, reason: str, evidence: Mapping[str, object], key: str, at: float | None = None,
) -> Envelope:
    """Repeated evidence for a state already reached; ``key`` makes re-recording idempotent."""
    event = IntentEvidence(
        thread_id=intent.thread_id, turn_id=intent.expected_turn_id, intent_id=intent.id,
        state=state, reason=reason, evidence=dict(evidence),
    )
    return _envelope(f"{intent.id}:evidence:{key}", event, at)


class LostRace(IntentError):
    """Another writer (the daemon, most often) moved the intent first: the move asked
    for was not made, and ``state`` is where the intent is now."""

    def __init__(self, message: str, state: str) -> None:
        super().__init__(message)
        self.state = state


def transition(
    recorder: Recorder, intent_id: str, to_state: State, reason: str,
    evidence: Mapping[str, object] | None = None, *, durable: bool = False, at: float | None = None,
) -> State:
    """Move one intent; the ledger refuses the move (``IllegalTransition``) if the
    table does not allow it from the state the intent is in now. ``LostRace``: another
    writer moved it between our read and our write, so the move was not made."""
    view = intent_view(recorder, intent_id)
    current = view.state
    check_transition(current, to_state, reason)  # a move outside the table is no race
    envelope = transition_envelope(view.intent, current, to_state, reason, evidence, at)
    try:
        result = recorder.append([envelope], durable=durable)
    except IllegalTransition as exc:
        raise _lost(recorder, intent_id, f"({exc})") from exc
    if envelope.event_id in result.conflicts:
        # the same move (same ids) was already recorded by another writer, for its own reason
        raise _lost(recorder, intent_id, "")
    return to_state


def _lost(recorder: Recorder, intent_id: str, detail: str) -> LostRace:
    now = intent_view(recorder, intent_id)
    last = now.history[-1] if now.history else None
    why = f" ({last.reason})" if last is not None and last.kind == "transition" else ""
    return LostRace(f"intent {intent_id} moved first: it is {now.state}{why} now, so this move was not made"
                    + (f" {detail}" if detail else ""), now.state)


def cancel(recorder: Recorder, intent_id: str, now: float | None = None) -> None:
    """Expire a still-proposed intent (reason ``cancelled``). ``IntentError`` when it is
    not proposed; ``LostRace`` when the daemon moved it while the cancel was written."""
    view = intent_view(recorder, intent_id)
    if view.state != State.PROPOSED:
        raise IntentError(
            f"intent {intent_id} is {view.state}: only a proposed intent can be cancelled"
            + (" (its delivery is under way; propose a new intent with --supersedes to replace it)"
               if view.state in (State.DISPATCH_UNKNOWN, State.QUEUED) else "")
        )
    transition(recorder, intent_id, State.EXPIRED, "cancelled", at=time.time() if now is None else now)


def intent_view(recorder: Recorder, intent_id: str) -> IntentView:
    """One intent, folded from its own events only (cheap: an indexed lookup)."""
    projection = Projection().fold(recorder.intent_entries(intent_id))
    view = projection.intents.get(intent_id)
    if view is None and projection.undecodable:
        seq, why = min(projection.undecodable.items())
        raise UnknownIntent(f"intent {printable(intent_id)}: its record at ledger seq {seq} cannot be decoded"
                            f" ({printable(why)})")
    if view is None:
        raise UnknownIntent(f"no intent {printable(intent_id)} in this ledger (list them with: tillerman intents)")
    return view


def _envelope(event_id: str, event, at: float | None) -> Envelope:
    return Envelope(event_id=event_id, event=event, source=SOURCE, at=at)
