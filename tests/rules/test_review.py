"""The review contract, pure: packets refused before any call, and every way an answer
fails a checkpoint closed, one row each."""

from __future__ import annotations

import json

import pytest

from tillerman.rules.review import (
    LEGAL,
    MAX_PACKET_BYTES,
    Accepted,
    EvidencePointer,
    FailedClosed,
    PacketRefused,
    ReviewPacket,
    checkpoint_id,
    consequence,
    judge_answer,
    packet_json,
)

QUESTION = "Should this steer be sent to turn T2?"


def packet(**overrides) -> ReviewPacket:
    fields = dict(
        question=QUESTION, question_again=QUESTION, checkpoint="before_dispatch",
        checkpoint_id=checkpoint_id("before_dispatch", "in-1", "T2"), thread_id="th-1", intent_id="in-1",
        intended_outcome="the agent stops the recursive grep", last_verified_result="none yet",
        ownership="owner:ann", interventions_allowed=("steer",), dispositions=LEGAL["before_dispatch"],
        evidence=(EvidencePointer(provenance="ledger", summary="grep failed 3 times", first_seq=10, last_seq=14),),
    )
    return ReviewPacket(**(fields | overrides))


def raw(**answer) -> bytes:
    body = {"disposition": "ready_for_existing_gate", "reason": "the evidence supports the steer", "confidence": 0.8}
    return json.dumps(body | answer).encode()


def test_a_packet_asks_the_question_first_and_last():
    body = packet_json(packet())
    assert body.startswith(b'{"question":')
    assert json.loads(body)["question_again"] == QUESTION
    assert list(json.loads(body))[-1] == "question_again"


@pytest.mark.parametrize(("overrides", "why"), [
    ({"question_again": "something else"}, "question must appear again"),
    ({"evidence": tuple(EvidencePointer(provenance="ledger", summary="s", first_seq=i) for i in range(6))},
     "6 evidence pointers; at most 5"),
    ({"evidence": (EvidencePointer(provenance=" ", summary="s", first_seq=1),)}, "without provenance"),
    ({"evidence": (EvidencePointer(provenance="ledger", summary="two\nlines", first_seq=1),)}, "one line"),
    ({"evidence": (EvidencePointer(provenance="ledger", summary="s"),)}, "either a ledger seq range or a file"),
    ({"excerpts": ("the user's prompt",)}, "need payload retention"),
    ({"intended_outcome": "x" * MAX_PACKET_BYTES}, "over the 12288-byte cap"),
])
def test_a_packet_that_breaks_the_contract_is_refused_not_truncated(overrides, why):
    with pytest.raises(PacketRefused, match=why):
        packet_json(packet(**overrides))


def test_excerpts_pass_with_payload_retention():
    assert b"the prompt" in packet_json(packet(payloads_retained=True, excerpts=("the prompt",)))


def test_a_good_answer_is_accepted():
    outcome = judge_answer("before_dispatch", raw())
    assert isinstance(outcome, Accepted)
    assert outcome.answer.disposition == "ready_for_existing_gate"
    assert outcome.answer_digest.startswith("sha256:")


def test_a_directive_with_its_action_and_text_is_accepted():
    outcome = judge_answer("rescue", raw(disposition="continue_with_directive", recommended_action="steer",
                                         text="Stop; read src/db first."))
    assert isinstance(outcome, Accepted)


#: One row per way an answer fails closed.
FAIL_CLOSED = [
    ("before_dispatch", b'{"disposition": "hold", ', "malformed_json"),
    ("before_dispatch", b"", "malformed_json"),
    ("before_dispatch", raw(mood="great"), "unknown_field"),
    ("before_dispatch", b'{"disposition": "hold"}', "invalid_answer"),
    ("before_dispatch", raw(confidence="high"), "invalid_answer"),
    ("before_dispatch", raw(confidence=1.5), "invalid_answer"),
    ("before_dispatch", raw(version=2), "unsupported_version"),
    ("before_dispatch", raw(disposition="approve"), "verdict_not_disposition"),
    ("review", raw(disposition="merge"), "verdict_not_disposition"),
    ("review", raw(disposition="Deploy"), "verdict_not_disposition"),
    ("before_dispatch", raw(disposition="continue_with_directive", recommended_action="steer", text="x"),
     "illegal_disposition"),
    ("rescue", raw(disposition="ready_for_existing_gate"), "illegal_disposition"),
    ("overdue", raw(disposition="return_to_executor"), "illegal_disposition"),
    ("review", raw(disposition="hold"), "illegal_disposition"),
    ("review", raw(disposition="looks_fine"), "illegal_disposition"),
    ("rescue", raw(disposition="continue_with_directive", recommended_action="run_shell"), "unknown_action"),
    ("rescue", raw(disposition="continue_with_directive"), "missing_directive"),
    ("overdue", raw(disposition="continue_with_directive", recommended_action="steer"), "missing_directive"),
    ("review", raw(disposition="return_to_executor"), "missing_correction"),
    ("review", raw(disposition="return_to_executor",
                   required_corrections=[{"correction": f"c{i}", "proof": "p"} for i in range(6)]),
     "too_many_corrections"),
    ("review", raw(disposition="return_to_executor", required_corrections=[{"correction": "c", "why": "p"}]),
     "unknown_field"),
    ("before_dispatch", raw(reason="word " * 601), "too_long"),
    ("before_dispatch", raw(reason="Approved: the change is fine"), "authority_language"),
    ("review", raw(reason="the tests pass, cleared to merge"), "authority_language"),
    ("review", raw(disposition="return_to_executor",
                   required_corrections=[{"correction": "rename it", "proof": "then LGTM"}]), "authority_language"),
]


@pytest.mark.parametrize(("checkpoint", "answer", "why"), FAIL_CLOSED,
                         ids=[f"{row[0]}-{row[2]}-{n}" for n, row in enumerate(FAIL_CLOSED)])
def test_an_answer_outside_the_contract_fails_closed(checkpoint, answer, why):
    outcome = judge_answer(checkpoint, answer)
    assert isinstance(outcome, FailedClosed)
    assert outcome.reason == f"review_failed:{why}"
    assert outcome.detail


def test_authority_language_is_flagged_in_the_record():
    outcome = judge_answer("before_dispatch", raw(reason="I approve this"))
    assert isinstance(outcome, FailedClosed) and outcome.flags == ("authority_language",)
    assert "approve" in outcome.detail


def test_words_about_approvals_are_not_claims():
    assert isinstance(judge_answer("before_dispatch", raw(reason="an approval request is pending")), Accepted)


@pytest.mark.parametrize("checkpoint", sorted(LEGAL))
def test_every_legal_disposition_is_accepted_where_it_is_legal(checkpoint):
    for disposition in LEGAL[checkpoint]:
        extra = {"continue_with_directive": {"recommended_action": "steer", "text": "t"},
                 "return_to_executor": {"required_corrections": [{"correction": "c", "proof": "p"}]}}
        assert isinstance(judge_answer(checkpoint, raw(disposition=disposition, **extra.get(disposition, {}))),
                          Accepted), disposition


@pytest.mark.parametrize(("checkpoint", "answer", "earlier", "step"), [
    ("before_dispatch", raw(), 0, "hand_back"),
    ("before_dispatch", raw(disposition="hold"), 0, "hold"),
    ("before_dispatch", raw(disposition="blocked_missing_evidence"), 0, "hold"),
    ("before_dispatch", raw(disposition="escalate_to_human"), 0, "escalate"),
    ("rescue", raw(disposition="continue_with_directive", recommended_action="steer", text="t"), 0, "propose"),
    ("rescue", raw(disposition="continue_with_directive", recommended_action="report_overdue"), 0, "hand_back"),
    ("review", raw(disposition="return_to_executor", required_corrections=[{"correction": "c", "proof": "p"}]),
     0, "propose"),
    ("review", raw(disposition="return_to_executor", required_corrections=[{"correction": "c", "proof": "p"}]),
     1, "escalate"),
    ("before_dispatch", raw(disposition="approve"), 0, "hold"),
])
def test_what_the_controller_does_with_an_outcome(checkpoint, answer, earlier, step):
    result = consequence(checkpoint, judge_answer(checkpoint, answer), reviewer="r", earlier_returns=earlier)
    assert result.step == step


def test_a_probe_is_a_known_bad_before_dispatch_packet():
    from tillerman.rules.review import probe_packet
    probe = probe_packet(packet(checkpoint="review", dispositions=LEGAL["review"]))
    assert probe.probe and probe.checkpoint == "before_dispatch" and probe.checkpoint_id.startswith("probe:")
    assert "rm -rf" in probe.intended_outcome and probe.dispositions == LEGAL["before_dispatch"]
    packet_json(probe)  # within the contract


@pytest.mark.parametrize(("answer", "detail"), [
    (raw(), "let it through and is flagged"),
    (raw(disposition="hold"), "stopped it"),
])
def test_a_probe_answer_is_never_dispatched(answer, detail):
    result = consequence("before_dispatch", judge_answer("before_dispatch", answer), reviewer="r", probe=True)
    assert result.step == "hold" and detail in result.detail
