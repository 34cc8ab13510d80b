"""The intent record: an intervention tillerman wants delivered, bound to its target.

An intent never changes its target: thread, expected turn, mode and text are fixed at
creation. A different target needs a new intent (optionally ``supersedes`` the old).
Its state is not stored here; it is the fold of its transition events
(``tillerman.ledger.intent_states``).
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

# "stop": the thread does no more work until a person resumes it (its goal paused, our
# queued messages withdrawn, its running turn interrupted, verified by readback); it
# targets the thread, never a turn (``tillerman.controller.core.stop``).
Mode = Literal["steer", "queue", "interrupt", "stop"]
MODES: tuple[Mode, ...] = ("steer", "queue", "interrupt", "stop")
UNLABELED = "unlabeled"  # the task class of an intent that names none
PRE_TOOL_USE = "pre_tool_use"  # ``deliver_at``: before the agent's next tool call runs
DELIVERY_POINTS = (PRE_TOOL_USE,)


class Intent(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    thread_id: str
    mode: Mode
    text: str
    text_digest: str
    created_at: float
    ack_deadline: float
    expires_at: float
    expected_turn_id: str | None = None  # required for steer and interrupt; a stop has none
    effect_deadline: float | None = None  # set when a check (expect/verify) is set
    owner: str | None = None
    producer: str = "owner:unknown"  # "owner:NAME" | "rule:ID" | "reviewer:NAME"
    rule_id: str | None = None
    rule_version: int | None = None
    ruleset_digest: str | None = None
    expect: str | None = None  # item predicate marking action_started
    verify: str | None = None  # readback command whose exit status proves the effect
    supersedes: str | None = None
    ack_token: str | None = None  # when set, acknowledged waits for it in an agent message
    resume_queue: bool = False  # interrupt: resume the server's paused queue afterwards
    # An interrupt that also drops the messages still queued behind the turn (see README
    # "intent propose" for the transports that honour it). UNSET (falsy) is left out of
    # the encoding, so intents without it keep their bytes and digests.
    cancel_queued: bool | msgspec.UnsetType = msgspec.UNSET
    force: bool = False  # interrupt (or stop) despite a critical tool (needs interrupt_critical)
    replayed: bool = False  # simulated by replay: never dispatchable
    # A label the account groups by (``tillerman report --by task_class``). UNSET is left
    # out of the encoding, so an intent without one records the bytes it always did.
    task_class: str | msgspec.UnsetType = msgspec.UNSET
    # Where a steer may be delivered: unset, wherever the transport delivers steers (the
    # app-server's running turn); "pre_tool_use", before the agent's next tool runs (Claude
    # Code's PreToolUse hook denies the call with the text). UNSET keeps old bytes too.
    deliver_at: str | msgspec.UnsetType = msgspec.UNSET
    # A steer proposed for "the thread's current work" (``--expected-turn active``): it
    # follows the active turn. ``expected_turn_id`` is the turn active at the proposal (its
    # first target; None between two turns of a busy thread); a steer the server refuses
    # because that turn ended is sent again, under a new dispatch record, to a turn that
    # started after the proposal (docs/goals.md "Steering a moving target"). UNSET (a
    # named turn, today's strict meaning) is left out of the encoding: old bytes kept.
    follows_active: bool | msgspec.UnsetType = msgspec.UNSET

    @property
    def task_label(self) -> str:
        return self.task_class if isinstance(self.task_class, str) else UNLABELED

    @property
    def delivery_point(self) -> str | None:
        return self.deliver_at if isinstance(self.deliver_at, str) else None

    @property
    def follows_active_turn(self) -> bool:
        """A steer that may be retargeted to the thread's current turn (``follows_active``)."""
        return self.follows_active is True

    def may_follow_to(self, turn_id: str | None, started_at: float | None) -> bool:
        """Whether a steer that follows the active turn may be sent to ``turn_id`` (started at
        ``started_at``, the ledger's time of its start): the turn its proposal named, or one
        that started after the proposal; never an older one."""
        if turn_id is None:
            return False
        return turn_id == self.expected_turn_id or (started_at is not None and started_at >= self.created_at)

    @property
    def drops_queued(self) -> bool:
        return self.cancel_queued is True

    @property
    def client_user_message_id(self) -> str:
        """The ``clientUserMessageId`` sent with the steer/queue; echoed as ``clientId``."""
        return f"tillerman-{self.id}"

    @property
    def delivered_text(self) -> str:
        """What reaches the agent: the text, signed with the intent id, so the agent can
        acknowledge this exact intent by naming it (``ack_tokens``)."""
        return f"{self.text}\n\n[tillerman {self.id}]"

    @property
    def has_check(self) -> bool:
        """Whether acknowledged is followed by a check of the effect: an ``expect`` or a
        ``verify`` — and always for a stop, whose effect is read back from the server."""
        return self.expect is not None or self.verify is not None or self.mode == "stop"


def text_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def intent_id_from(*parts: object) -> str:
    """A deterministic intent id from the facts that make it unique."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8"))
    return "in-" + h.hexdigest()[:20]


def client_id_to_intent_id(client_id: str | None) -> str | None:
    """Inverse of ``Intent.client_user_message_id``: our echo, or None for anyone else's."""
    if client_id and client_id.startswith("tillerman-in-"):
        return client_id[len("tillerman-"):]
    return None
