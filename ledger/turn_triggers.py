"""What started a turn, where the source does not say: the live inference.

The app-server's wire marks no continuation: ``turn/started`` carries only the turn, and
a goal's continuation has no ``userMessage`` item (its prompt is hidden input). A rollout
says (``task_started.turn_attribution.turn_trigger``); the live side infers it from what
the fold saw around the turn's start, here, as a pure function of those facts, so the
rule is one table (tests/ledger/test_turn_triggers.py) and the projection only gathers
the facts (``TurnOpening``).
"""

from __future__ import annotations

import msgspec

#: How soon after the thread's previous turn ended (or its goal became active) a turn with
#: no user message counts as the goal's continuation. Codex 0.171 starts the next one
#: 5–10 ms after a turn ends (~10 ms after a goal is set on an idle thread); a second
#: leaves room for a loaded machine and stays far below anything a person types.
GOAL_CONTINUATION_SECONDS = 1.0

#: ``TurnOpening.first_input``: the turn's first input was a user message sent with a
#: queued message's client id ("queue"), any other user message ("user"), or something
#: else came first ("none": the model's output, a tool call).
FIRST_INPUTS = ("user", "queue", "none")


class TurnOpening(msgspec.Struct, frozen=True):
    """The facts of a live turn's start the inference reads."""

    goal_active: bool  # the thread's goal was active when the turn started
    # Seconds from the thread's previous turn's end, or from its goal becoming active,
    # whichever was later, to the turn's start; None when neither was seen.
    gap: float | None = None
    first_input: str | None = None  # one of FIRST_INPUTS; None: nothing seen in the turn yet


def infer_trigger(opening: TurnOpening) -> str:
    """"queue", "user", "goal" or "unknown" for a turn the wire does not label.

    A user message that opens the turn names its trigger (a queued message's client id
    makes it "queue"). A turn without one that started while the goal was active, right
    after the previous turn ended or the goal was set, is the goal's continuation. Until
    the turn's first input is seen the answer is provisional: a continuation and a
    ``turn/start`` look alike for the milliseconds before the user message arrives."""
    if opening.first_input in ("user", "queue"):
        return opening.first_input
    if opening.goal_active and opening.gap is not None and 0 <= opening.gap <= GOAL_CONTINUATION_SECONDS:
        return "goal"
    return "unknown"
