"""Every error message the real app-server 0.163.0 answers with, read into a refusal.

Messages are copied from reference/codex-app-server.md (§2 "Error semantics", §3, §4,
A4) and from probes of thread/turns/list and thread/queue/start.
"""

import pytest

from tillerman.controller.core.rpc_errors import Refusal, classify
from tillerman.monitor.jsonrpc import RpcError

ACTIVE = "01a229c4-3730-7c10-9d2e-5b7f0c9e1a01"
OLD = "01a229c4-1111-7c10-9d2e-5b7f0c9e1a01"

CASES = [
    # (message, refusal, evidence extracted besides code and message)
    (f"expected active turn id `bogus-turn-id` but found `{ACTIVE}`", Refusal.STALE_TURN,
     {"expected_turn_id": "bogus-turn-id", "found_turn_id": ACTIVE}),
    (f"expected active turn id `{OLD}` but found `{ACTIVE}`", Refusal.STALE_TURN,
     {"expected_turn_id": OLD, "found_turn_id": ACTIVE}),
    (f"expected active turn id stale-id but found {ACTIVE}", Refusal.STALE_TURN,  # interrupt: no backticks
     {"expected_turn_id": "stale-id", "found_turn_id": ACTIVE}),
    ("no active turn to steer", Refusal.NO_ACTIVE_TURN, {"operation": "steer"}),
    ("no active turn to interrupt", Refusal.NO_ACTIVE_TURN, {"operation": "interrupt"}),
    ("thread not found: 00000000-0000-0000-0000-000000000000", Refusal.THREAD_NOT_FOUND,
     {"thread_id": "00000000-0000-0000-0000-000000000000"}),
    ("thread not loaded: 00000000-0000-0000-0000-000000000000", Refusal.THREAD_NOT_FOUND,
     {"thread_id": "00000000-0000-0000-0000-000000000000"}),
    ("input must not be empty", Refusal.INVALID_INPUT, {}),
    ("thread already has an active or pending turn", Refusal.QUEUE_BUSY, {}),
    ("queued submission not found: bogus", Refusal.REFUSED, {"queued_submission_id": "bogus"}),
    ("queue is empty", Refusal.REFUSED, {}),
    ("queue reorder must include every queued submission exactly once", Refusal.INVALID_INPUT, {}),
    ("Invalid request: unknown variant `bogus`, expected one of `notLoaded`, `summary`, `full`", Refusal.REFUSED,
     {"detail": "unknown variant `bogus`, expected one of `notLoaded`, `summary`, `full`"}),
    ("Invalid request: missing field `params`", Refusal.REFUSED, {"detail": "missing field `params`"}),
]


@pytest.mark.parametrize(("message", "refusal", "extracted"), CASES, ids=[c[0][:40] for c in CASES])
def test_each_real_message_is_a_definite_refusal_with_its_evidence(message, refusal, extracted):
    read = classify(RpcError(-32600, message))
    assert read.refusal is refusal and read.definite
    assert read.evidence == {"code": -32600, "message": message, **extracted}


@pytest.mark.parametrize("message", [
    "Not initialized",  # not a refusal of the request's content
    "internal error: turn/steer failed after submit",  # a failure that may have had effects
    "expected active turn id `a` but found `b` (retrying)",  # anchored: a longer message is another message
    "please note: no active turn to steer",
    "thread not found",  # no id: not the server's message
    "expected active turn id a b but found c",
    "",
])
def test_an_unrecognized_message_is_not_a_refusal(message):
    read = classify(RpcError(-32603, message))
    assert read.refusal is None and not read.definite
    assert read.evidence == {"code": -32603, "message": message}


def test_the_steer_form_keeps_backticks_out_of_the_turn_ids():
    read = classify(RpcError(-32600, f"expected active turn id `x` but found `{ACTIVE}`"))
    assert read.evidence["found_turn_id"] == ACTIVE  # never "`…`": this id is evidence, not a target
