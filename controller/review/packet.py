"""The review packet for one intent, built from what the ledger recorded of it.

Pure: the intent's folded view, the rule set and the reviewer in, a
``tillerman.rules.review.ReviewPacket`` out. Evidence is pointed at (ledger seqs, with
who recorded them and one line on what), never copied: the intent's own text is
tillerman's, and nothing of the agent's prompts or tool output is included.
"""

from __future__ import annotations

from tillerman.ledger.projections import HistoryItem, IntentView
from tillerman.rules.review import LEGAL, MAX_POINTERS, MAX_SUMMARY_CHARS, EvidencePointer, Reviewer, ReviewPacket
from tillerman.rules.review import checkpoint_id as make_checkpoint_id
from tillerman.rules.ruleset import GRANTABLE_ACTIONS, RuleSet

#: The question each checkpoint asks, about intent {id} ({mode} to thread {thread}).
QUESTIONS = {
    "before_dispatch": "Intent {id} ({mode} to thread {thread}) was proposed by {producer}. Should it go on to the"
                       " existing gate (the policy and grants decide), be held, or go to its owner?",
    "rescue": "Thread {thread} stalled or failed again on the same turn while intent {id} ({mode}) was open."
              " Which one registered action should come next, or should the owner be asked?",
    "overdue": "Intent {id} ({mode} to thread {thread}) is overdue for the second time. Continue with a directive,"
               " escalate to its owner, or is evidence missing?",
    "review": "The turn that took intent {id} ({mode} to thread {thread}) has ended. Did the intervention take"
              " effect, or must the executor correct something?",
}


def packet_for_intent(view: IntentView, checkpoint: str, reviewer: Reviewer, ruleset: RuleSet) -> ReviewPacket:
    intent = view.intent
    question = QUESTIONS[checkpoint].format(id=intent.id, mode=intent.mode, thread=intent.thread_id,
                                            producer=intent.producer)
    outcome = f"{intent.mode}: {intent.text}"
    if intent.expect:
        outcome += f" (started when an item matches {intent.expect})"
    if intent.verify:
        outcome += f" (effect proven by: {intent.verify})"
    transitions = [item for item in view.history if item.kind in ("proposed", "transition")]
    last = transitions[-1] if transitions else None
    return ReviewPacket(
        question=question,
        question_again=question,
        checkpoint=checkpoint,
        checkpoint_id=make_checkpoint_id(checkpoint, intent.id, intent.expected_turn_id),
        thread_id=intent.thread_id,
        intent_id=intent.id,
        intended_outcome=outcome,
        last_verified_result=f"{view.state}: {last.reason}" if last else str(view.state),
        contradictory_evidence=tuple(f"seq {item.seq}: {item.state}: {item.reason}"
                                     for item in view.history if item.kind == "evidence")[-MAX_POINTERS:],
        ownership=f"owner {intent.owner or 'unknown'}; produced by {intent.producer}",
        interventions_allowed=tuple(action for action in GRANTABLE_ACTIONS
                                    if ruleset.allows(reviewer.producer, action, intent.thread_id)),
        dispositions=LEGAL[checkpoint],
        evidence=tuple(_pointer(item) for item in view.history[-MAX_POINTERS:]),
    )


def _pointer(item: HistoryItem) -> EvidencePointer:
    summary = f"{item.kind}: {item.state}: {item.reason}".replace("\n", " ")
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[: MAX_SUMMARY_CHARS - 1] + "…"
    return EvidencePointer(provenance="tillerman ledger (intent record)", summary=summary,
                           first_seq=item.seq, last_seq=item.seq)
