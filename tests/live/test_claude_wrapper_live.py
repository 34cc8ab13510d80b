"""``tillerman claude`` between a harness and the real Claude Code CLI 2.1.332, beside a
running daemon (files only, no app-server): the daemon decides, the wrapper carries out.

The harness is `fixtures.claude_cli.ClaudeSession`, spawning the wrapper in place of the
CLI; the wrapper runs the real CLI (``$TILLERMAN_CLAUDE_BIN``) against the scripted model.
The daemon follows an empty folder, or (``TRANSCRIPTS``) the session's transcripts as
README's wrapper example has it: the session seen through the wrapper and its transcript
is one set of turns.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession, is_result, is_tool_use
from tests.live.daemon_support import OWNER, OWNER_GRANT
from tillerman.controller.claude.relay import message_uuid
from tillerman.controller.core.intent_requests import propose
from tillerman.ledger import projections
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import IntentView, ThreadState
from tillerman.ledger.sqlite import SQLiteRecorder

pytestmark = pytest.mark.live

TILLERMAN = [sys.executable, "-m", "tillerman"]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


#: Run a test with the daemon following the transcripts (``HOME/.claude/projects``) too.
TRANSCRIPTS = pytest.mark.parametrize("daemon", ["files", "transcripts"], indirect=True)


@pytest.fixture
def daemon(tmp_path: Path, ledger: Path, request: pytest.FixtureRequest) -> Iterator[subprocess.Popen]:
    """``tillerman run`` on the ledger, following no app-server: it only decides. It
    watches an empty folder, or with the parameter "transcripts" the scratch HOME's
    transcripts (``ClaudeSession`` runs the CLI in ``tmp_path/home``)."""
    config = tmp_path / "config.toml"
    watched = tmp_path / ("home/.claude/projects" if getattr(request, "param", "files") == "transcripts" else "watched")
    config.write_text(OWNER_GRANT)
    watched.mkdir(parents=True)
    process = subprocess.Popen([*TILLERMAN, "run", "--no-codex", "--watch", str(watched), "--ledger", str(ledger),
                                "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield process
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)


def wrapped(tmp_path: Path, ledger: Path, claude_cli: Path) -> tuple[Path, dict[str, str]]:
    """A stand-in for the CLI that runs it under ``tillerman claude``, and its environment."""
    script = tmp_path / "claude-under-tillerman"
    script.write_text(f'#!/bin/sh\nexec {" ".join(TILLERMAN)} claude --ledger {ledger} -- "$@" 2>>{tmp_path / "wrapper.log"}\n')
    script.chmod(0o755)
    return script, {"TILLERMAN_CLAUDE_BIN": str(claude_cli), "PYTHONPATH": os.pathsep.join(sys.path)}


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def view(ledger: Path, intent_id: str) -> IntentView:
    with SQLiteRecorder(ledger) as recorder:
        return projections.load(recorder).intents[intent_id]


def thread(ledger: Path, thread_id: str) -> ThreadState:
    with SQLiteRecorder(ledger) as recorder:
        return projections.load(recorder).threads[thread_id]


def steerable_turn(ledger: Path, thread_id: str, turn_id: str) -> bool:
    """The session is steerable and runs ``turn_id``'s turn, under whichever id the thread
    knows it by: beside the hooks, the hook's start may come first and the wrapper's id
    becomes its alias."""
    with SQLiteRecorder(ledger) as recorder:
        projection = projections.load(recorder)
    snapshot = projection.snapshot(thread_id)
    known = projection.threads.get(thread_id)
    return (snapshot.steerable and known is not None and snapshot.active_turn_id is not None
            and snapshot.active_turn_id == known.canonical_turn(turn_id))


def propose_intent(ledger: Path, **request: Any) -> str:
    with SQLiteRecorder(ledger) as recorder:
        return propose(recorder, owner=OWNER, **request).id


def settled(ledger: Path, intent_id: str) -> IntentView | None:
    found = view(ledger, intent_id)
    return found if found.state not in (State.PROPOSED, State.DISPATCH_UNKNOWN, State.QUEUED) else None


def ended(found: IntentView) -> tuple[str, str]:
    """The intent's last move: its state and the reason."""
    last = [item for item in found.history if item.kind == "transition"][-1]
    return str(last.state), last.reason


def moves(found: IntentView) -> list[tuple[str, str, str]]:
    return [(item.kind, str(item.state), item.reason) for item in found.history if item.kind != "decision"]


def held(gate: Path) -> str:
    """A Bash command that runs until the test calls ``release(gate)``: the turn's tool round
    stays open for a steer to fold into until the test lets it end (a fixed sleep races a
    loaded machine, where the daemon's decision and the wrapper's pickup may take seconds).
    ``cat`` of a FIFO in the session's folder: a read the CLI runs without asking."""
    os.mkfifo(gate)
    return f"cat {gate}"


def release(gate: Path) -> None:
    """Ends ``held(gate)``'s command: its ``cat`` reads a line and the FIFO's end."""
    deadline = time.monotonic() + 10
    while True:
        try:
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader yet (ENXIO)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        os.write(fd, b"released\n")
        os.close(fd)
        return


def running_tool(harness: ClaudeSession, ledger: Path, command: str) -> tuple[str, str]:
    """Start a turn whose Bash call runs ``command``; once the call runs and the wrapper
    has recorded the turn (steerable), the session and the turn."""
    turn = harness.user(f"RUN: {command}")
    harness.wait_for(is_tool_use)
    session = harness.session_id
    wait_until(lambda: steerable_turn(ledger, session, turn), "the wrapper's record of the running turn")
    return session, turn


@TRANSCRIPTS
def test_a_steer_is_folded_into_its_turn_and_acknowledged_on_the_cli_s_evidence(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon,
        request: pytest.FixtureRequest) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        gate = tmp_path / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: mention bananas",
                                   expected_turn=turn, now=time.time())
        wait_until(lambda: view(ledger, intent_id).state == State.QUEUED, "the CLI to accept the steer")
        release(gate)
        result = harness.wait_for(is_result, timeout=20)
        done = wait_until(lambda: settled(ledger, intent_id), "the steer to settle")
        assert harness.close() == 0
    assert "STEER: mention bananas" in result["result"]  # folded into this turn, at its tool round
    assert result["user_message_uuids"] == [turn, message_uuid(f"tillerman-{intent_id}")]
    assert len(harness.results()) == 1  # one turn: not a turn of its own
    assert done.state == State.ACKNOWLEDGED
    assert moves(done)[-3:] == [("transition", "dispatch_unknown", "dispatching"),
                                ("transition", "queued", "accepted"), ("transition", "acknowledged", "echo")]
    assert done.history[-1].evidence["turn_id"] == turn
    if request.node.callspec.params["daemon"] == "transcripts":  # the transcript's turn is the wrapper's
        wait_until(lambda: thread(ledger, session).turn_aliases, "the daemon to read the transcript's turn")
    assert thread(ledger, session).turn_states == {turn: "completed"}  # one turn, not one per source
    # The harness saw none of the lifecycle of tillerman's message.
    ours = message_uuid(f"tillerman-{intent_id}")
    assert not [line for line in harness.lines if line.get("command_uuid") == ours]
    decided = next(item.at for item in done.history if item.kind == "decision")
    claimed = next(item.at for item in done.history if item.state == "dispatch_unknown")
    print(f"pickup: {1000 * (claimed - decided):.0f} ms from the daemon's decision to the wrapper's claim")
    assert json.dumps(result)  # the result line reached the harness whole


def steered(model: AnthropicModel, text: str) -> int:
    """How many model calls got ``text`` as new input (the newest user message)."""
    return sum(any(text in said for said in request.texts) for request in model.requests)


def test_a_steer_for_a_turn_that_ended_is_not_injected_into_the_next(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    release = tmp_path / "release"
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        turn = harness.user(f"WAIT: {release}")  # a turn with no tool round to fold a steer into
        session = harness.session_id
        wait_until(lambda: steerable_turn(ledger, session, turn), "the wrapper's record of the running turn")
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: too late for this",
                                   expected_turn=turn, now=time.time())
        time.sleep(0.5)  # decided by now; the wrapper waits for a tool round that never comes
        release.touch()
        harness.wait_for(is_result)
        done = wait_until(lambda: settled(ledger, intent_id), "the steer to settle")
        start = len(harness.lines)
        harness.user("RUN: sleep 1")  # the next turn, with a tool round
        harness.wait_for(is_result, start=start)
        assert harness.close() == 0
    assert ended(done) == ("expired", "turn_ended")
    assert not [item for item in done.history if item.state == "dispatch_unknown"]  # never sent
    assert steered(anthropic_model, "STEER: too late for this") == 0
    assert all(len(result["user_message_uuids"]) == 1 for result in harness.results())


@TRANSCRIPTS
def test_an_interrupt_kills_the_running_tool_and_is_recorded_as_separate_facts(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        session, turn = running_tool(harness, ledger, "sleep 20")
        intent_id = propose_intent(ledger, thread_id=session, mode="interrupt", text="stop the sleep",
                                   expected_turn=turn, now=time.time())
        result = harness.wait_for(is_result, timeout=15)  # well before the 20 s the tool would take
        done = wait_until(lambda: settled(ledger, intent_id), "the interrupt to settle")
        cut = harness.wait_for(lambda line: line.get("type") == "user" and "stopped while running" in json.dumps(line))
        harness.close()
    assert (result["terminal_reason"], result["is_error"]) == ("aborted_tools", True)
    assert cut["message"]["content"][0]["is_error"] is True  # the call was killed mid-run
    # The request, its answer and the aborted turn: three facts, in that order.
    assert moves(done)[1:5] == [("transition", "dispatch_unknown", "dispatching"),
                                ("evidence", "dispatch_unknown", "interrupt_answered"),
                                ("transition", "queued", "accepted"),
                                ("transition", "acknowledged", "turn_interrupted")]
    answered = next(item for item in done.history if item.reason == "interrupt_answered")
    assert answered.evidence["subtype"] == "success"
    # The harness saw the aborted turn, never the answer to tillerman's request.
    assert not [line for line in harness.lines if line.get("type") == "control_response"]


def tee_cli(tmp_path: Path, claude_cli: Path) -> Path:
    """The CLI with what it reads and writes copied to files: the traffic the wrapper sees."""
    script = tmp_path / "claude-teed"
    script.write_text(f'#!/bin/sh\ntee -a {tmp_path / "cli-in.jsonl"} | {claude_cli} "$@" '
                      f'| tee -a {tmp_path / "cli-out.jsonl"}\n')
    script.chmod(0o755)
    return script


def test_permission_requests_pass_through_and_the_harness_sees_the_cli_s_bytes_apart_from_tillerman_s_own(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    env["TILLERMAN_CLAUDE_BIN"] = str(tee_cli(tmp_path, claude_cli))
    sent: list[bytes] = []
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, "--permission-mode", "default",
                       "--permission-prompt-tool", "stdio", env=env) as harness:
        send = harness.send
        harness.send = lambda message: (sent.append(json.dumps(message).encode() + b"\n"), send(message))[1]
        gate = tmp_path / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: touch nothing",
                                   expected_turn=turn, now=time.time())
        wait_until(lambda: view(ledger, intent_id).state == State.QUEUED, "the CLI to accept the steer")
        release(gate)
        harness.wait_for(is_result)
        wait_until(lambda: settled(ledger, intent_id), "the steer to settle")
        start = len(harness.lines)
        harness.user("RUN: touch perm_probe.txt")
        asked = harness.wait_for(lambda line: line.get("type") == "control_request", start=start)
        time.sleep(0.5)  # were the wrapper to answer, it would have by now
        assert not (tmp_path / "ws" / "perm_probe.txt").exists()
        request = asked["request"]
        harness.send({"type": "control_response", "response": {
            "subtype": "success", "request_id": asked["request_id"],
            "response": {"behavior": "allow", "updatedInput": request["input"]}}})
        harness.wait_for(is_result, start=start)
        assert harness.close() == 0
    assert (tmp_path / "ws" / "perm_probe.txt").exists()
    ours_uuid = message_uuid(f"tillerman-{intent_id}")
    cli_in = (tmp_path / "cli-in.jsonl").read_bytes().splitlines(keepends=True)
    cli_out = (tmp_path / "cli-out.jsonl").read_bytes().splitlines(keepends=True)
    harness_in = (tmp_path / "stdout.jsonl").read_bytes().splitlines(keepends=True)

    def tillerman_s(raw: bytes) -> bool:
        line = json.loads(raw)
        request_id = line.get("request_id") or (line.get("response") or {}).get("request_id") or ""
        return ours_uuid in (line.get("uuid"), line.get("command_uuid")) or request_id.startswith("tillerman-")

    assert [raw for raw in cli_in if not tillerman_s(raw)] == sent  # the harness's lines, byte for byte
    assert [raw for raw in cli_in if tillerman_s(raw)]  # and the steer, interleaved
    assert [raw for raw in cli_out if not tillerman_s(raw)] == harness_in  # the CLI's, byte for byte
    answers = [json.loads(raw) for raw in cli_in if json.loads(raw).get("type") == "control_response"]
    assert [a["response"]["request_id"] for a in answers] == [asked["request_id"]]  # the harness's only
    with SQLiteRecorder(ledger) as recorder:
        kinds = [type(entry.envelope.event).__name__ for entry in recorder.read()
                 if entry.envelope.event.thread_id == session]
    assert "ApprovalRequested" in kinds and "ApprovalResolved" in kinds


def cli_child(wrapper_pid: int) -> int:
    children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_killed_wrapper_resumed_delivers_nothing_twice_and_settles_from_the_transcript(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    with ClaudeSession(script, first, anthropic_model.base_url, env=env) as harness:
        gate = first / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: only once",
                                   expected_turn=turn, now=time.time())
        wait_until(lambda: view(ledger, intent_id).state == State.QUEUED, "the CLI to accept the steer")
        cli = cli_child(harness.process.pid)
        harness.process.kill()  # the wrapper dies with the steer accepted, not yet folded in
        harness.process.wait(timeout=10)
        release(gate)
        wait_until(lambda: gone(cli), "the orphaned CLI to finish its turn and exit", timeout=20)
    assert view(ledger, intent_id).state == State.QUEUED  # nobody saw the fold
    # The same session, resumed under a new wrapper (same HOME and cwd: the transcript is found).
    second.mkdir()
    (second / "home").symlink_to(first / "home")
    (second / "ws").symlink_to(first / "ws")
    with ClaudeSession(script, second, anthropic_model.base_url, "--resume", session, env=env) as harness:
        harness.user("RUN: sleep 1")
        harness.wait_for(is_result)
        done = wait_until(lambda: settled(ledger, intent_id), "the steer to settle from the transcript")
        assert harness.close() == 0
    assert done.state == State.ACKNOWLEDGED
    assert done.history[-1].evidence["turn_id"] == turn
    assert len([item for item in done.history if item.state == "dispatch_unknown"]) == 1
    assert steered(anthropic_model, "STEER: only once") == 1


def test_a_queued_message_runs_as_its_own_turn_and_one_past_its_expiry_is_withdrawn(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        # The stale message expires 1.5 s after its proposal; the tool's turn ends once it
        # has and the other message waits in the CLI's queue.
        gate = tmp_path / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        later = propose_intent(ledger, thread_id=session, mode="queue", text="LATER: run me after", now=time.time())
        stale = propose_intent(ledger, thread_id=session, mode="queue", text="LATER: never run me", expires=1.5,
                               now=time.time())
        withdrawn = wait_until(lambda: settled(ledger, stale), "the stale message to be withdrawn")
        wait_until(lambda: view(ledger, later).state == State.QUEUED, "the CLI to queue the other message")
        release(gate)
        ran = wait_until(lambda: settled(ledger, later), "the queued message to run", timeout=20)
        harness.wait_for(lambda line: is_result(line) and len(harness.results()) == 2)
        assert harness.close() == 0
    # read again once the wrapper has exited: the CLI's answer to the withdrawal may come after the expiry
    withdrawn = view(ledger, stale)
    assert ended(withdrawn) == ("expired", "expires_at_passed")
    assert any(item.reason == "withdrawn" and item.evidence["cancelled"] is True for item in withdrawn.history), \
        [(item.state, item.reason, item.evidence) for item in withdrawn.history]
    assert ended(ran) == ("acknowledged", "queue_turn_started")
    first, second = harness.results()
    assert first["user_message_uuids"] == [turn]  # not folded into the running turn
    assert second["user_message_uuids"] == [message_uuid(f"tillerman-{later}")]
    assert steered(anthropic_model, "LATER: run me after") == 1
    assert steered(anthropic_model, "LATER: never run me") == 0


def test_an_interrupt_that_cancels_the_queue_drops_our_queued_message(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    with ClaudeSession(script, tmp_path, anthropic_model.base_url, env=env) as harness:
        session, turn = running_tool(harness, ledger, "sleep 20")
        queued = propose_intent(ledger, thread_id=session, mode="queue", text="LATER: dropped", now=time.time())
        wait_until(lambda: view(ledger, queued).state == State.QUEUED, "the CLI to queue the message")
        stop = propose_intent(ledger, thread_id=session, mode="interrupt", text="stop, and drop the queue",
                              expected_turn=turn, cancel_queued=True, now=time.time())
        harness.wait_for(is_result, timeout=15)
        dropped = wait_until(lambda: settled(ledger, queued), "the queued message to be dropped")
        stopped = wait_until(lambda: settled(ledger, stop), "the interrupt to settle")
        assert harness.close() == 1  # the last turn was interrupted
    assert len(harness.results()) == 1  # the dropped message never ran
    assert ended(dropped) == ("expired", "lost_after_accept")
    assert ended(stopped) == ("acknowledged", "turn_interrupted")
    answered = next(item for item in stopped.history if item.reason == "interrupt_answered")
    assert answered.evidence["cancelled"] == 1
    assert steered(anthropic_model, "LATER: dropped") == 0


def test_a_wrapper_killed_between_its_dispatch_record_and_the_write_settles_not_delivered_on_resume(
        claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path, ledger: Path, daemon) -> None:
    script, env = wrapped(tmp_path, ledger, claude_cli)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    with ClaudeSession(script, first, anthropic_model.base_url, env={**env, "TILLERMAN_KILL_AT": "dispatch_recorded"}
                       ) as harness:
        gate = first / "ws" / "gate"
        session, turn = running_tool(harness, ledger, held(gate))
        cli = cli_child(harness.process.pid)
        intent_id = propose_intent(ledger, thread_id=session, mode="steer", text="STEER: never written",
                                   expected_turn=turn, now=time.time())
        assert harness.process.wait(timeout=30) == -signal.SIGKILL  # at its durable dispatch record
        release(gate)
        wait_until(lambda: gone(cli), "the orphaned CLI to finish its turn and exit", timeout=20)
    assert view(ledger, intent_id).state == State.DISPATCH_UNKNOWN  # sent or not: the ledger cannot tell
    second.mkdir()
    (second / "home").symlink_to(first / "home")
    (second / "ws").symlink_to(first / "ws")
    with ClaudeSession(script, second, anthropic_model.base_url, "--resume", session, env=env) as harness:
        harness.user("RUN: sleep 1")
        harness.wait_for(is_result)
        done = wait_until(lambda: settled(ledger, intent_id), "the steer to settle from the transcript")
        assert harness.close() == 0
    assert ended(done) == ("expired", "not_delivered")  # absent from the turn, which ended: never resent
    assert len([item for item in done.history if item.state == "dispatch_unknown"]) == 1
    assert steered(anthropic_model, "STEER: never written") == 0
