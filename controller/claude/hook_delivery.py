"""The daemon's side of delivery through Claude Code's hooks: what goes in each session's
outbox, and how a claimed intent settles from what the spool shows afterwards.

A thread seen only through the hook spool (``ThreadSnapshot.hook_delivery``, no app-server)
takes a queued message (at a Stop) and a steer that asked for ``deliver_at =
"pre_tool_use"`` (``tillerman.rules.policy.capabilities``). When the policy authorizes
one, the daemon puts it in the session's outbox (``tillerman.controller.claude.hook_outbox``);
the hook claims it (``proposed → dispatch_unknown``, ``tillerman.controller.claude.hook_claim``)
and answers. From there the delivery machine's own states and reasons carry it: the
delivered text read back from the spool (``tillerman.monitor.claude_hooks`` turns the
continued turn into a user message with our ``client_id``) is the echo that
acknowledges it (``Delivery`` handles the ``Reconcile`` fact as after a restart); the
turn the claim was made in ending without that echo is ``expired / not_delivered``:
the spool holds every hook event of the session, so nothing can still arrive. A
steer's denied call that ran anyway (``DenyNotHonoured``) is evidence against delivery:
``expired / deny_not_honoured`` at once, whatever else the turn shows.
"""

from __future__ import annotations

from pathlib import Path

from tillerman.controller.claude.hook_claim import VIA
from tillerman.controller.claude.hook_outbox import AT_PRE_TOOL_USE, AT_STOP, Outbox, Parcel, outbox_path, write_outbox
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.intent_requests import transition_envelope
from tillerman.controller.core.reconcile import reconcile_fact
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import HistoryItem, IntentView, Projection
from tillerman.ledger.snapshot import ENDED_TURN_STATES, ThreadSnapshot
from tillerman.monitor.tailer import SUFFIX


def is_hook_thread(snapshot: ThreadSnapshot) -> bool:
    """Delivered to through its hooks: seen in a hook spool, and not on an app-server."""
    return snapshot.hook_delivery and not snapshot.steerable


def parcel(view: IntentView, snapshot: ThreadSnapshot) -> Parcel:
    """What the hook needs: a steer's expected turn under every id the sources give it
    (the hook knows it by ``prompt_id``, the daemon may by the transcript's uuid)."""
    intent = view.intent
    at_tool = intent.mode == "steer" and intent.delivery_point is not None
    turn_ids = snapshot.turn_ids(intent.expected_turn_id) if at_tool else ()
    return Parcel(intent_id=intent.id, at=AT_PRE_TOOL_USE if at_tool else AT_STOP, text=intent.delivered_text,
                  expected_turn=turn_ids[0] if turn_ids else None, turn_aliases=turn_ids[1:])


def hook_claim(view: IntentView) -> HistoryItem | None:
    """The claim a hook recorded for this intent, if a hook claimed it."""
    return next((item for item in view.history if item.kind == "transition"
                 and item.state == State.DISPATCH_UNKNOWN and item.evidence.get("via") == VIA), None)


def settle(projection: Projection, view: IntentView, now: float) -> list[Envelope]:
    """What the ledger shows now about a hook delivery under way: the echo acknowledges
    it (the machine decides, as for any transport); the claim's turn ended without it
    expires it ``not_delivered``; otherwise nothing yet."""
    claim = hook_claim(view)
    if claim is None or view.state is not State.DISPATCH_UNKNOWN:
        return []
    refuted = not_honoured(projection, view, now)
    if refuted:
        return refuted
    output = Delivery.from_view(view).handle(reconcile_fact(projection, view, now))
    if output.envelopes:
        return list(output.envelopes)  # the machine's commands are an app-server's: none here
    turn = claim.evidence.get("turn_id")
    status = projection.snapshot(view.intent.thread_id).turn_state(turn if isinstance(turn, str) else None)
    if status not in ENDED_TURN_STATES:
        return []
    evidence = {"turn_id": turn, "turn_status": status, "via": VIA}
    return [transition_envelope(view.intent, State.DISPATCH_UNKNOWN, State.EXPIRED, "not_delivered", evidence, now)]


def not_honoured(projection: Projection, view: IntentView, now: float) -> list[Envelope]:
    """The call our hook denied to deliver the steer ran: the model got its output, not
    our text, so the intent expires, never to be read as acknowledged."""
    thread = projection.threads.get(view.intent.thread_id)
    call = thread.not_honoured.get(view.intent.client_user_message_id) if thread else None
    if call is None:
        return []
    evidence = {"tool_use_id": call, "via": VIA}
    return [transition_envelope(view.intent, State.DISPATCH_UNKNOWN, State.EXPIRED, "deny_not_honoured", evidence,
                                now)]


class Outboxes:
    """The outboxes of the hook-delivered sessions under the watched spools: one parcel
    per intent the policy last authorized and nobody has claimed yet."""

    def __init__(self, spools: tuple[str, ...], ledger: str) -> None:
        self.spools = tuple(Path(s) for s in spools)
        self.ledger = ledger
        self._wanted: dict[str, dict[str, IntentView]] = {}  # thread -> intent id -> intent
        self._written: dict[str, tuple[Parcel, ...]] = {}

    def want(self, view: IntentView) -> None:
        self._wanted.setdefault(view.intent.thread_id, {})[view.intent.id] = view

    def drop(self, view: IntentView) -> None:
        self._wanted.get(view.intent.thread_id, {}).pop(view.intent.id, None)

    def flush(self, projection: Projection) -> None:
        """Write every outbox that changed; an intent no longer proposed (claimed,
        cancelled, expired) leaves its outbox."""
        for thread_id, wanted in self._wanted.items():
            for intent_id in [i for i in wanted if (v := projection.intents.get(i)) is None
                              or v.state is not State.PROPOSED]:
                del wanted[intent_id]
            snapshot = projection.snapshot(thread_id)
            now = tuple(parcel(view, snapshot) for view in sorted(wanted.values(), key=lambda v: v.intent.created_at))
            if now == self._written.get(thread_id, ()):
                continue
            spool = self._spool_of(thread_id)
            if spool is not None:
                write_outbox(outbox_path(spool, thread_id), Outbox(self.ledger, now))
                self._written[thread_id] = now

    def _spool_of(self, thread_id: str) -> Path | None:
        """The watched spool that holds the session's hook file (``<spool>/<session_id>.jsonl``)."""
        return next((s for s in self.spools if (s / f"{thread_id}{SUFFIX}").exists()), None)
