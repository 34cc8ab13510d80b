"""The real ``codex exec --json`` as a reviewer, against the scripted model: the packet
reaches the model after the contract's instructions, the answer comes back as the final
agent message, and it is judged like any other. The reviewer runs in its own home, so the
session it writes lands there and nowhere tillerman watches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fixtures.codex_npm import codex_under_test
from fixtures.codex_server import make_codex_home
from fixtures.scripted_model import ScriptedModel
from tests.controller.test_reviewer import packet
from tillerman.controller.review.reviewer import ask
from tillerman.rules.review import Accepted, Reviewer

pytestmark = [pytest.mark.live]


def test_codex_exec_json_answers_a_review_packet(scripted_model: ScriptedModel, tmp_path: Path):
    home = tmp_path / "reviewer-home"
    home.mkdir()
    configured = make_codex_home(scripted_model.base_url, parent=tmp_path)
    shutil.copytree(configured, home / ".codex")
    reviewer = Reviewer(name="codex", adapter="codex-exec-json", timeout=120.0, home=str(home),
                        command=(str(codex_under_test()), "exec", "--json",
                                 "--skip-git-repo-check", "-"))
    asked = ask(reviewer, "before_dispatch", packet())
    assert isinstance(asked.outcome, Accepted), asked.outcome
    assert asked.outcome.answer.disposition == "ready_for_existing_gate"
    assert asked.outcome.answer.reason == "scripted review of before_dispatch:in-1@T2"
    assert asked.tokens is not None and asked.tokens > 0
    prompts = [r for r in scripted_model.requests if "Review packet:" in str(r)]
    assert prompts, "the packet never reached the model"
    assert any((home / ".codex" / "sessions").rglob("*.jsonl"))  # its session stays in its own home
