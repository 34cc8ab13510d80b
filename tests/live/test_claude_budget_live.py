"""A budget rule on a Claude Code session, against the real CLI 2.1.332 and the scripted
Anthropic server reporting chosen usage: ``tillerman run`` follows the session's
transcript (where each response's usage is) with a ``budget`` rule of tokens per thread.

Interactive (hooks installed): the steer the crossing proposes reaches the model through
the PreToolUse hook's deny, once, however many usage lines follow, and is acknowledged;
the ledger's intent holds the figure that crossed. Headless (``tillerman claude``): the
budget's interrupt ends the running turn. The scripted model's request log is the ground
truth for what reached the model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.anthropic_model import DEFAULT_USAGE, AnthropicModel, ReportedUsage
from fixtures.claude_cli import ClaudeSession, is_result
from fixtures.rule_texts import grant, rule
from tests.live.test_claude_hook_delivery_live import answered, moves, requests_saying, until, view
from tests.live.test_claude_wrapper_live import wrapped
from tillerman.controller.cli.main import main
from tillerman.ledger import projections
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.ledger.usage import claude_tokens

pytestmark = pytest.mark.live

RULE = "thread-tokens"
LIMIT = 50_000
WRAP_UP = "Over budget: {figure} tokens (limit {limit} per {per}). Wrap up now."
#: The first call's usage crosses the limit alone; every later call reports the default.
CROSSING = ReportedUsage(start={"input_tokens": 60_000, "output_tokens": 1}, final={"output_tokens": 40})


def usage_by_call(number: int) -> ReportedUsage:
    return CROSSING if number == 1 else DEFAULT_USAGE


@contextmanager
def budgeted(tmp_path: Path, action: str, *, spool: Path | None) -> Iterator[Path]:
    """``tillerman run`` following the scratch HOME's transcripts (and the hook spool,
    when hooks are installed) with the budget rule and its grant: the ledger."""
    home, ledger = tmp_path / "home", tmp_path / "ledger.sqlite3"
    projects = home / ".claude" / "projects"
    projects.mkdir(parents=True)
    (tmp_path / "rules.toml").write_text(rule(
        RULE, condition={"kind": "budget", "measure": "tokens", "over": LIMIT, "per": "thread"},
        action=action, text=WRAP_UP))
    (tmp_path / "config.toml").write_text(grant(f"rule:{RULE}", [action], threads="*"))
    watch = ["--watch", str(projects)]
    if spool is not None:
        spool.mkdir(parents=True)
        installed = CliRunner(env={"HOME": str(home)}).invoke(
            main, ["hooks", "install", "--claude", "--user", "--spool", str(spool)])
        assert installed.exit_code == 0, installed.output
        watch += ["--watch", str(spool)]
    SQLiteRecorder(ledger).close()
    daemon = subprocess.Popen([sys.executable, "-m", "tillerman", "run", "--no-codex", *watch, "--ledger", str(ledger),
                               "--rules", str(tmp_path / "rules.toml"), "--config", str(tmp_path / "config.toml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    try:
        yield ledger
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


def rule_intents(ledger: Path) -> list[str]:
    with SQLiteRecorder(ledger) as recorder:
        return [i for i, v in projections.load(recorder).intents.items() if v.intent.producer == f"rule:{RULE}"]


def wrap_up(tokens: int) -> str:
    return WRAP_UP.format(figure=f"{tokens:,}", limit=f"{LIMIT:,}", per="thread")


def test_a_session_over_its_budget_is_steered_through_the_pre_tool_use_hook_once(
        claude_cli: Path, tmp_path: Path) -> None:
    spool, ws = tmp_path / "ws" / "spool", tmp_path / "ws"
    crossed = CROSSING.start["input_tokens"] + CROSSING.final["output_tokens"]
    # Two calls in one message, each writing a file (so the CLI runs them one after the
    # other, each after its own PreToolUse; Bash is allowed, so none asks): the first waits until the daemon has put the
    # budget's steer in the outbox, so the second's hook has it to deliver. Were the
    # daemon quick enough for the first call's hook, that call is the one denied: either
    # way the steer is delivered once, at a tool call (in our runs, mostly the first).
    waiter = (f"for i in $(seq 300); do ls {spool}/*.outbox.json >/dev/null 2>&1 && break; sleep 0.1; done; "
              f"touch {ws}/first-ran")
    with AnthropicModel(usage=usage_by_call) as model, budgeted(tmp_path, "steer", spool=spool) as ledger, \
            ClaudeSession(claude_cli, tmp_path, model.base_url, "--allowedTools", "Bash") as session:
        session.user(f"RUN ALL: {waiter} ;; touch {ws}/second-ran")
        session.wait_for(is_result, timeout=90)
        [intent_id] = until(lambda: rule_intents(ledger), "the budget's intent")
        until(lambda: view(ledger, intent_id).state is State.ACKNOWLEDGED, "the steer to be acknowledged", 30)
        session_id = session.session_id
        assert session.close(timeout=60) == 0
    assert claude_tokens({**CROSSING.start, **CROSSING.final}).total == crossed
    text = wrap_up(crossed)
    reached = requests_saying(model, text, 0)
    assert len(reached) == 1  # once, never again
    assert [out for out in reached[0].tool_outputs if out.startswith("PreToolUse:Bash hook error:") and text in out]
    assert len(model.requests) >= 2  # usage kept arriving after the crossing, without a second finding
    found = view(ledger, intent_id).intent  # the figure that crossed, in the ledger
    assert (found.thread_id, found.mode, found.text, found.delivery_point) == (session_id, "steer", text, "pre_tool_use")
    assert moves(ledger, intent_id) == [("dispatch_unknown", "dispatching", "claude-hook"),
                                        ("acknowledged", "echo", None)]
    assert [at for at, delivered in answered(spool, session_id) if delivered == intent_id] == ["PreToolUse"]


def test_a_headless_session_over_its_budget_is_interrupted_by_the_wrapper(claude_cli: Path, tmp_path: Path) -> None:
    """Headless, through ``tillerman claude``: stream-json carries no per-response usage,
    so the daemon counts the transcript the CLI writes beside it (the session's one
    thread); the budget's interrupt is carried out by the wrapper and ends the turn
    while its tool still runs."""
    crossed = CROSSING.start["input_tokens"] + CROSSING.final["output_tokens"]
    script, env = wrapped(tmp_path, tmp_path / "ledger.sqlite3", claude_cli)
    with AnthropicModel(usage=usage_by_call) as model, budgeted(tmp_path, "interrupt", spool=None) as ledger, \
            ClaudeSession(script, tmp_path, model.base_url, "-p", "--allowedTools", "Bash", env=env) as harness:
        # A long call the CLI does not refuse (it blocks a plain ``sleep 30`` as a wait).
        harness.user("RUN: python3 -c 'import time; time.sleep(30)'")
        result = harness.wait_for(is_result, timeout=25)  # well before the 30 s the tool would take
        [intent_id] = until(lambda: rule_intents(ledger), "the budget's intent")
        until(lambda: view(ledger, intent_id).state is State.ACKNOWLEDGED, "the interrupt to settle", 30)
        session_id = harness.session_id
        harness.close(timeout=60)
    assert (result["terminal_reason"], result["is_error"]) == ("aborted_tools", True)
    assert len(model.requests) == 1  # nothing after the call that crossed
    found = view(ledger, intent_id).intent
    assert (found.thread_id, found.mode, found.text) == (session_id, "interrupt", wrap_up(crossed))
    [*_, last] = [(h.state, h.reason) for h in view(ledger, intent_id).history if h.kind == "transition"]
    assert last == ("acknowledged", "turn_interrupted")
