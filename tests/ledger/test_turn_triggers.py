"""The live trigger inference (tillerman.ledger.turn_triggers.infer_trigger), as a table."""

import pytest

from tillerman.ledger.turn_triggers import GOAL_CONTINUATION_SECONDS, TurnOpening, infer_trigger

SOON = 0.008  # Codex 0.171 starts a continuation 5-10 ms after the previous turn's end
LATE = GOAL_CONTINUATION_SECONDS + 0.5


@pytest.mark.parametrize(("goal_active", "gap", "first_input", "trigger"), [
    # a user message opening the turn says who started it, goal or not
    (False, None, "user", "user"),
    (True, SOON, "user", "user"),
    (True, SOON, "queue", "queue"),
    (False, LATE, "queue", "queue"),
    # no user message, goal active, right after the previous turn: a continuation
    (True, SOON, "none", "goal"),
    (True, SOON, None, "goal"),  # provisional: nothing seen in the turn yet
    (True, 0.0, "none", "goal"),
    (True, GOAL_CONTINUATION_SECONDS, "none", "goal"),
    # too long after, or no goal active, or nothing to measure from: not known
    (True, LATE, "none", "unknown"),
    (False, SOON, "none", "unknown"),
    (True, None, "none", "unknown"),
    (False, None, None, "unknown"),
    (True, -1.0, "none", "unknown"),  # a start before the end it follows: clocks disagree
])
def test_inference_table(goal_active, gap, first_input, trigger):
    assert infer_trigger(TurnOpening(goal_active=goal_active, gap=gap, first_input=first_input)) == trigger
