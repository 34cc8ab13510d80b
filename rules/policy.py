"""The policy: what to do next with one intent, given what is known about its thread.

``decide`` is pure (no I/O, no clock, no randomness), total (it returns a Decision
for every well-typed input) and deterministic, so replay and live give the same
decision for the same inputs. The controller carries a decision out and records
what happened. The spine is the seed's sketch, as a ``match`` on the intent's state:

    state             condition (first that holds)                     action            reason
    ----------------  -----------------------------------------------  ----------------  ---------------------------
    terminal          -                                                observe           terminal
    dispatch_unknown  a stop withdrew our queued message               reconcile         withdrawn
                      expected turn ended                              reconcile         expected_turn_ended
                      otherwise (never resend, whatever the deadlines) reconcile         delivery_unknown
    queued            a stop withdrew our queued message               reconcile         withdrawn
                      expected turn ended                              reconcile         expected_turn_ended
                      now >= expires_at                                report_overdue    expires_at_passed
                      now >= ack_deadline                              report_overdue    ack_deadline_passed
                      otherwise                                        observe           awaiting_ack
    acknowledged,     now >= effect_deadline                           expire            effect_deadline_passed
    action_started    a stop (its readback is due, or under way)       reconcile         stop_unverified
                      acknowledged and an ``expect`` is set            observe           awaiting_action_start
                      a ``verify`` is set                              verify_effect     effect_unverified
                      otherwise (action started, nothing to verify)    observe           awaiting_effect_deadline
    proposed          now >= expires_at                                expire            expires_at_passed
                      snapshot of another thread                       reconcile_turn    snapshot_thread_mismatch
                      thread never seen                                reconcile_turn    thread_unknown
                      steer/interrupt without an expected turn (other  escalate          missing_expected_turn
                        than a steer that follows the active turn)
                      steer/interrupt, expected turn ended (other      expire            turn_ended
                        than a steer that follows the active turn)
                      a rule's or reviewer's steer/queue/interrupt     observe           thread_stopped
                        on a stopped thread (until a person resumes it)
                      approval pending                                 observe_critical  approval_pending
                      external effect unknown                          observe_critical  external_effect_unknown
                      critical tool, forced interrupt or stop without  observe_critical  critical_tool_force_not_granted
                        interrupt_critical
                      critical tool (other than a granted forced       observe_critical  critical_tool
                        interrupt or stop)
                      steer/queue while another writer's message,      observe           other_writer_input
                        folded into the running turn, is unanswered
                      steer that follows the active turn:
                        no active turn                                 reconcile_turn    awaiting_next_turn
                        the active turn started before the proposal    reconcile_turn    active_turn_predates_proposal
                          (and is not the turn it named)
                      steer/interrupt, no active turn                  reconcile_turn    no_active_turn
                      steer/interrupt, another turn active             reconcile_turn    expected_turn_not_active
                      thread only followed through files (not replay)  escalate          not_steerable
                        (a Claude Code hook session takes a queue, and a
                        steer with deliver_at=pre_tool_use: takes)
                      producer is a rule not active (or expired)       escalate          rule_not_active
                      producer rule's version is not the active one    escalate          rule_version_changed
                      no grant for producer, mode, thread              escalate          no_grant
                      replayed intent                                  observe           replayed_would_<mode>
                      forced interrupt (stop) through a critical tool  interrupt (stop)  forced_during_critical_tool
                      otherwise                                        <mode>            authorized

Safety choices:
- Pending approvals and unknown external effects hold every mode, forced or not:
  an interrupt during an approval races the human's answer, and an interrupt never
  undoes an effect that already crossed its boundary, it only multiplies the
  uncertainty. A critical tool holds everything except an interrupt (or a stop)
  with ``force=True`` whose producer holds ``interrupt_critical`` for the thread (as
  well as ``interrupt``, or ``stop``).
- A stop targets the thread, not a turn: it needs no expected turn and no active
  one (an idle goal thread is stopped by pausing its goal). It holds for the same
  hazards as an interrupt: it ends the running turn.
- A stopped thread stays stopped (``tillerman.ledger.stopped``): after a stop was
  carried out, a rule's or a reviewer's steer, queue or interrupt waits (until it
  expires, or a person resumes the thread); a person's own goes through. A queued
  message of ours that a stop deleted from the server's queue can never start a turn:
  its machine settles it (``expired withdrawn``) instead of it being reported overdue.
- Queue mode needs no active turn (the message waits for the turn to end), but the
  hazards hold it too: the conservative reading of the seed, at the cost of a delay.
- Authority is the producer's (who asked), not the owner's (who answers for it): a
  reviewer recommending a steer for Ann's intent cannot borrow Ann's grant.
- A queued intent past ``expires_at`` is reported, not expired: an accepted message
  may still arrive, and only the readback once its turn ends can say it did not.
- A thread never seen is looked up (``reconcile_turn``), not refused: the monitor
  may simply not have caught up yet.
- ``escalate`` refuses a request that may not be carried out and hands it to the
  owner; the controller rejects the intent with the matching transition reason
  (``no_grant``; ``missing_expected_turn`` → ``invalid``; ``not_steerable``,
  ``rule_not_active``, ``rule_version_changed`` → ``not_dispatchable``).
"""

from __future__ import annotations

from tillerman.ledger.intent_states import State, is_terminal
from tillerman.ledger.intents import PRE_TOOL_USE, Intent
from tillerman.ledger.snapshot import ENDED_TURN_STATES, ThreadSnapshot
from tillerman.ledger.stopped import held_while_stopped
from tillerman.rules.decision import Action, Decision
from tillerman.rules.ruleset import INTERRUPT_CRITICAL, RuleSet

#: Turn states after which a turn can no longer receive a steer or an interrupt.
#: "unclosed" counts: the next turn started (or the source ended) first.

RULE_PREFIX = "rule:"
#: The modes whose message the agent reads in the running turn or right after it: held
#: while another writer's input is folded in (``tillerman.ledger.writers``).
_WRITES_INTO_TURNS = ("steer", "queue")
#: The modes that end a turn, and so may be forced through a critical tool.
FORCEABLE_MODES = ("interrupt", "stop")


def decide(intent: Intent, state: State, snapshot: ThreadSnapshot, now: float, ruleset: RuleSet) -> Decision:
    action, reason = _next_step(intent, state, snapshot, now, ruleset)
    rule_id, rule_version = producing_rule(intent)
    return Decision(action=action, reason=reason, rule_id=rule_id, rule_version=rule_version)


def producing_rule(intent: Intent) -> tuple[str | None, int | None]:
    """The rule (id, version) that produced the intent, from its producer."""
    if intent.producer.startswith(RULE_PREFIX):
        return intent.producer[len(RULE_PREFIX):], intent.rule_version
    return None, None


def _next_step(
    intent: Intent, state: State, snapshot: ThreadSnapshot, now: float, ruleset: RuleSet
) -> tuple[Action, str]:
    match state:
        case _ if is_terminal(state, intent):
            return Action.OBSERVE, "terminal"
        case State.DISPATCH_UNKNOWN | State.QUEUED if intent.id in snapshot.withdrawn:
            # A stop deleted it from the server's queue: it can never start a turn, and
            # its machine settles it (expired withdrawn) instead of waiting for an echo.
            return Action.RECONCILE, "withdrawn"
        case State.DISPATCH_UNKNOWN:
            # Never resend: only the echo or a readback after the turn ends settles it.
            if _expected_turn_ended(intent, snapshot):
                return Action.RECONCILE, "expected_turn_ended"
            return Action.RECONCILE, "delivery_unknown"
        case State.QUEUED:
            # Accepted but not echoed: it may still arrive, so it is reported, never
            # resent, and not expired here (the readback at turn end settles it).
            if _expected_turn_ended(intent, snapshot):
                return Action.RECONCILE, "expected_turn_ended"
            if now >= intent.expires_at:
                return Action.REPORT_OVERDUE, "expires_at_passed"
            if now >= intent.ack_deadline:
                return Action.REPORT_OVERDUE, "ack_deadline_passed"
            return Action.OBSERVE, "awaiting_ack"
        case State.ACKNOWLEDGED | State.ACTION_STARTED:
            return _effect_step(intent, state, now)
        case _:  # proposed, the only state left
            return _proposed_step(intent, snapshot, now, ruleset)


def _expected_turn_ended(intent: Intent, snapshot: ThreadSnapshot) -> bool:
    return snapshot.turn_state(intent.expected_turn_id) in ENDED_TURN_STATES


def _effect_step(intent: Intent, state: State, now: float) -> tuple[Action, str]:
    if intent.effect_deadline is not None and now >= intent.effect_deadline:
        return Action.EXPIRE, "effect_deadline_passed"
    if intent.mode == "stop":
        # Its machine reads the thread back (and steps in again while work is found); a
        # restart finds the readback through this reconcile.
        return Action.RECONCILE, "stop_unverified"
    if state is State.ACKNOWLEDGED and intent.expect is not None:
        return Action.OBSERVE, "awaiting_action_start"
    if intent.verify is not None:
        return Action.VERIFY_EFFECT, "effect_unverified"
    return Action.OBSERVE, "awaiting_effect_deadline"


def _proposed_step(intent: Intent, snapshot: ThreadSnapshot, now: float, ruleset: RuleSet) -> tuple[Action, str]:
    if now >= intent.expires_at:
        return Action.EXPIRE, "expires_at_passed"
    if snapshot.thread_id != intent.thread_id:
        return Action.RECONCILE_TURN, "snapshot_thread_mismatch"
    if not snapshot.known:
        return Action.RECONCILE_TURN, "thread_unknown"
    targets_turn = intent.mode in ("steer", "interrupt")
    named_turn = targets_turn and not intent.follows_active_turn  # a following steer waits for the next turn
    if named_turn and intent.expected_turn_id is None:
        return Action.ESCALATE, "missing_expected_turn"
    if named_turn and _expected_turn_ended(intent, snapshot):
        return Action.EXPIRE, "turn_ended"
    if snapshot.stopped_by is not None and held_while_stopped(intent):
        # A stop's effect is that the thread does no more work until a person resumes
        # it: a rule's later message would start it again. It waits, or expires.
        return Action.OBSERVE, "thread_stopped"
    found = hazard(intent, snapshot, ruleset)
    if found is not None:
        return Action.OBSERVE_CRITICAL, found
    if intent.mode in _WRITES_INTO_TURNS and snapshot.other_writer_input:
        # Another writer's message is being folded into the running turn: ours would be
        # read with it, unannounced. Wait until the agent answered it.
        return Action.OBSERVE, "other_writer_input"
    if targets_turn:
        turn_problem = _turn_problem(intent, snapshot)
        if turn_problem is not None:
            return Action.RECONCILE_TURN, turn_problem
    if not intent.replayed and not takes(intent, snapshot):
        # replay simulates supervision of a recorded session as if attached to it
        return Action.ESCALATE, "not_steerable"
    refusal = _refusal(intent, now, ruleset)
    if refusal is not None:
        return Action.ESCALATE, refusal
    if intent.replayed:
        return Action.OBSERVE, f"replayed_would_{intent.mode}"
    if snapshot.critical_tool:  # only a granted forced interrupt (or stop) gets this far
        return Action(intent.mode), "forced_during_critical_tool"
    return Action(intent.mode), "authorized"


#: What a thread reached only through Claude Code's hooks can take: a queued message at
#: the turn's end (the Stop hook's block), a steer before the next tool call
#: (PreToolUse's deny). No hook reaches a running model call, and none can end a turn.
STEER_AT_PRE_TOOL_USE = f"steer@{PRE_TOOL_USE}"
_APP_SERVER_TAKES = ("steer", "queue", "interrupt", "stop")
_WRAPPER_TAKES = ("steer", "queue", "interrupt")  # ``tillerman claude``: no goal to pause, no stop
_HOOKS_TAKE = ("queue", STEER_AT_PRE_TOOL_USE)


def capabilities(snapshot: ThreadSnapshot) -> tuple[str, ...]:
    """The intents the thread can be sent (``tillerman status`` shows them; ``takes``
    decides by them): everything over a connection that steers it, what the hooks
    carry for a session seen through them, nothing for one only followed in files."""
    if snapshot.steerable:
        return _WRAPPER_TAKES if snapshot.wrapped else _APP_SERVER_TAKES
    return _HOOKS_TAKE if snapshot.hook_delivery else ()


def takes(intent: Intent, snapshot: ThreadSnapshot) -> bool:
    """Whether the thread can be sent this intent (``capabilities``); a steer that asks
    for ``deliver_at = "pre_tool_use"`` is a steer to a thread that takes any."""
    can = capabilities(snapshot)
    return intent.mode in can or (intent.mode == "steer" and intent.delivery_point == PRE_TOOL_USE
                                  and STEER_AT_PRE_TOOL_USE in can)


def hazard(intent: Intent, snapshot: ThreadSnapshot, ruleset: RuleSet) -> str | None:
    """Why nothing may be sent to the thread right now, if anything. The one definition of
    the hazards: the adapter's boundary (``tillerman.controller.core.boundary``) judges an
    interrupt by it again just before the send."""
    found = send_hazard(snapshot)
    if found != "critical_tool" or not (intent.mode in FORCEABLE_MODES and intent.force):
        return found
    if not ruleset.allows(intent.producer, INTERRUPT_CRITICAL, intent.thread_id):
        return "critical_tool_force_not_granted"
    return None


def send_hazard(snapshot: ThreadSnapshot) -> str | None:
    """What holds any send to the thread now, whoever asks (only a granted forced
    interrupt passes a critical tool: ``hazard``). A steer that follows the active turn
    is sent again to a new turn only when this is None."""
    if snapshot.approval_pending:
        return "approval_pending"
    if snapshot.external_effect_unknown:
        return "external_effect_unknown"
    if snapshot.critical_tool:
        return "critical_tool"
    return None


def _turn_problem(intent: Intent, snapshot: ThreadSnapshot) -> str | None:
    """Why a steer or interrupt cannot target its expected turn right now (a steer that
    follows the active turn: why it cannot be sent to the running turn)."""
    if intent.follows_active_turn:
        if snapshot.active_turn_id is None:
            return "awaiting_next_turn"
        if not intent.may_follow_to(snapshot.active_turn_id, snapshot.active_turn_started_at) \
                and not snapshot.is_active(intent.expected_turn_id):
            return "active_turn_predates_proposal"
        return None
    if snapshot.active_turn_id is None:
        return "no_active_turn"
    if not snapshot.is_active(intent.expected_turn_id):  # under any source's id of the turn
        return "expected_turn_not_active"
    return None


def _refusal(intent: Intent, now: float, ruleset: RuleSet) -> str | None:
    """Why a well-formed request is not authorized, if it is not."""
    rule_id, rule_version = producing_rule(intent)
    if rule_id is not None:
        rule = ruleset.rule(rule_id)
        # Shadow rules are evaluated and recorded, never dispatched.
        if rule is None or rule.status != "active" or not rule.in_force(now):
            return "rule_not_active"
        if rule_version is not None and rule_version != rule.version:
            return "rule_version_changed"
    if not ruleset.allows(intent.producer, intent.mode, intent.thread_id):
        return "no_grant"
    return None
