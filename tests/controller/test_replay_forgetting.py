"""Replay keeps what later decisions read, not every thread and intent it ever folded."""

import shutil

from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.chain_only import ChainOnlyRecorder
from tillerman.ledger.memory import MemoryRecorder
from tillerman.rules.config import load_effective

STUCK = "fixtures/disagreement/stuck/rollout-2026-10-21T14-00-00-0199b000-0000-7000-8000-00000000dd01.jsonl"
ROLLOUTS = "fixtures/sessions/codex-rollout"
PINNED_DIGEST = "sha256:4dd36ffe4e5c39a8b2a276631f5b2e784e1cb13fd458e48558a58e14e6680f59"


def test_a_finished_session_leaves_no_thread_and_no_settled_intent():
    """The stuck session's steer is refused (settled) and its last turn ends: after the
    file, neither its thread nor the intent is held; the summary still counts it."""
    replayer = Replayer(ChainOnlyRecorder(), load_effective(None, None).ruleset)
    summary = replayer.run([STUCK])
    assert summary.intents == {"rejected": 1} and summary.decisions == 1
    assert replayer.projection.intents == {}
    assert replayer.projection.threads == {}


def test_forgetting_changes_no_decision(tmp_path):
    """Rollouts after rollouts, a session replayed twice (the same file named again)
    and one copied: the decisions digest is the one of a replay that keeps everything
    (its digest pinned from before threads were forgotten)."""
    copy = tmp_path / "copy.jsonl"
    shutil.copy(STUCK, copy)
    paths = [ROLLOUTS, STUCK, "fixtures/disagreement", str(copy), STUCK]
    ruleset = load_effective(None, None).ruleset
    summary = Replayer(ChainOnlyRecorder(), ruleset).run(paths)
    assert summary == Replayer(MemoryRecorder(), ruleset).run(paths)
    assert summary.decisions_digest == PINNED_DIGEST
    # 136 events: the folder's rollouts (the Codex 0.171 goal session's among them, with 9 usage events) and the stuck session
    assert (summary.decisions, summary.intents, summary.events, summary.reports) == (1, {"rejected": 1}, 136, 2)
