"""Delivery through Claude Code's hooks: the daemon decides and fills the session's outbox;
the hook claims the intent in the ledger (``dispatch_unknown``) and answers; the spool's
next event of the turn acknowledges it; a busy ledger makes the hook fail open."""

import datetime
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
from click.testing import CliRunner

from tests.monitor.support import events
from tillerman.controller.claude import hook_claim
from tillerman.controller.claude.hook_delivery import parcel, settle
from tillerman.controller.claude.hook_outbox import Outbox, outbox_path, read_outbox, write_outbox
from tillerman.controller.claude.settings import TIMEOUT_SECONDS
from tillerman.controller.cli.main import _daemon_lines, main
from tillerman.controller.core import intent_requests as intents
from tillerman.controller.core.supervisor import Step
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import projections
from tillerman.ledger.errors import IllegalTransition
from tillerman.ledger.events import (
    DenyNotHonoured,
    Envelope,
    IntentProposed,
    ItemCompleted,
    ThreadStarted,
    TurnCompleted,
    Usage,
    UserMessage,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.ledger.usage import Tokens
from tillerman.rules.config import load_effective
from tillerman.rules.decision import Action
from tillerman.rules.owner import local_login
from tillerman.rules.policy import capabilities, decide, takes
from tillerman.rules.ruleset import Budget, Grant, Rule, build_ruleset

SESSION = "5e551011-0000-4000-8000-000000000001"
PROMPT = "p-1"


def payload(event: str, turn: str | None = PROMPT, **fields) -> dict:
    base = {"session_id": SESSION, "transcript_path": "/t.jsonl", "cwd": "/ws", "hook_event_name": event}
    return base | ({"prompt_id": turn} if turn else {}) | fields


def hook(spool: Path, event: dict) -> dict | None:
    """Runs ``tillerman hook claude`` on one payload; Claude Code's answer, if any."""
    result = CliRunner().invoke(main, ["hook", "claude", "--spool", str(spool)], input=json.dumps(event))
    assert result.exit_code == 0, result.output
    return json.loads(result.output) if result.output.strip() else None


def propose(ledger: Path, mode: str = "queue", text: str = "RUN: echo pears", **fields) -> Intent:
    with SQLiteRecorder(ledger) as recorder:
        return intents.propose(recorder, thread_id=SESSION, mode=mode, text=text, owner=local_login(), **fields)


def state(ledger: Path, intent_id: str):
    with SQLiteRecorder(ledger) as recorder:
        return intents.intent_view(recorder, intent_id)


def spool_lines(spool: Path) -> list[dict]:
    return [json.loads(line) for line in (spool / f"{SESSION}.jsonl").read_text().splitlines()]


def fill_outbox(spool: Path, ledger: Path, *chosen: Intent) -> None:
    with SQLiteRecorder(ledger) as recorder:
        views = [intents.intent_view(recorder, i.id) for i in chosen]
    spool.mkdir(exist_ok=True)
    write_outbox(outbox_path(spool, SESSION), Outbox(str(ledger), tuple(parcel(v, ThreadSnapshot(thread_id=SESSION)) for v in views)))


def test_a_queued_intent_blocks_one_stop_and_is_claimed_once(tmp_path: Path) -> None:
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    first, second = propose(ledger), propose(ledger, text="RUN: echo plums")
    fill_outbox(spool, ledger, first)
    assert hook(spool, payload("PreToolUse", tool_name="Bash", tool_input={"command": "ls"})) is None
    assert hook(spool, payload("Stop", stop_hook_active=False)) == {"decision": "block",
                                                                     "reason": first.delivered_text}
    view = state(ledger, first.id)
    assert view.state is State.DISPATCH_UNKNOWN
    claim = view.history[-1]
    assert (claim.reason, claim.evidence["via"], claim.evidence["turn_id"]) == ("dispatching", "claude-hook", PROMPT)
    assert spool_lines(spool)[-1]["tillerman"]["delivered"] == first.id
    # The stop chain goes on with our text: its next Stop is never blocked for the same intent...
    assert hook(spool, payload("Stop", stop_hook_active=True)) is None
    # ...but it is when another intent is waiting.
    fill_outbox(spool, ledger, first, second)
    assert hook(spool, payload("Stop", stop_hook_active=True))["reason"] == second.delivered_text
    assert hook(spool, payload("Stop", stop_hook_active=True)) is None
    assert state(ledger, second.id).state is State.DISPATCH_UNKNOWN


def test_a_cancelled_intent_left_in_the_outbox_is_not_delivered(tmp_path: Path) -> None:
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    intent = propose(ledger)
    fill_outbox(spool, ledger, intent)
    with SQLiteRecorder(ledger) as recorder:
        intents.cancel(recorder, intent.id)
    assert hook(spool, payload("Stop", stop_hook_active=False)) is None
    assert state(ledger, intent.id).state is State.EXPIRED


def test_a_steer_for_the_next_tool_denies_it_in_its_turn_only(tmp_path: Path) -> None:
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    steer = propose(ledger, mode="steer", text="Use rg, not grep.", expected_turn=PROMPT, deliver_at="pre_tool_use")
    fill_outbox(spool, ledger, steer)
    assert read_outbox(outbox_path(spool, SESSION)).parcels[0].at == "PreToolUse"
    tool = {"tool_name": "Bash", "tool_input": {"command": "grep -r x"}, "tool_use_id": "toolu_1"}
    assert hook(spool, payload("Stop", stop_hook_active=False)) is None  # a steer never waits for the turn's end
    assert hook(spool, payload("PreToolUse", turn="p-other", **tool)) is None
    assert hook(spool, payload("PreToolUse", **tool)) == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": steer.delivered_text}}
    assert state(ledger, steer.id).state is State.DISPATCH_UNKNOWN


def test_a_busy_ledger_makes_the_hook_answer_nothing_in_time_and_say_so(tmp_path: Path) -> None:
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    intent = propose(ledger)
    fill_outbox(spool, ledger, intent)
    holder = sqlite3.connect(ledger, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a long write transaction elsewhere
    try:
        done = subprocess.run([sys.executable, "-m", "tillerman.controller.claude_hook", "--spool", str(spool)],
                              input=json.dumps(payload("Stop", stop_hook_active=False)).encode(),
                              capture_output=True, timeout=TIMEOUT_SECONDS)  # Claude Code's limit for it
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (done.returncode, done.stdout) == (0, b"")  # no decision: the agent goes on
    assert spool_lines(spool)[-1]["tillerman"] == {"fail_open": "ledger_busy", "intent_id": intent.id}
    assert state(ledger, intent.id).state is State.PROPOSED  # nothing claimed: the next Stop may deliver it
    assert hook(spool, payload("Stop", stop_hook_active=False))["reason"] == intent.delivered_text


def parse(lines: list[dict]) -> list:
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return events("claude-hooks", data)


def test_the_spool_reads_a_continued_stop_chain_as_our_message_in_one_turn() -> None:
    delivered = {"delivered": "in-1", "attempt": "a", "text": "RUN: echo pears"}
    events = parse([payload("UserPromptSubmit", prompt="hi"), payload("Stop", stop_hook_active=False,
                                                                       tillerman=delivered),
                    payload("PreToolUse", tool_name="Bash", tool_input={"command": "echo pears"}, tool_use_id="t1"),
                    payload("PostToolUse", tool_name="Bash", tool_input={"command": "echo pears"}, tool_use_id="t1",
                            tool_response={"stdout": "pears"}),
                    payload("Stop", stop_hook_active=True)])
    ours = [e for e in events if isinstance(e, UserMessage) and e.client_id == "tillerman-in-1"]
    assert [(e.turn_id, e.item_id) for e in ours] == [(PROMPT, "hook:in-1")]
    assert [(e.turn_id, e.status) for e in events if isinstance(e, TurnCompleted)] == [(PROMPT, "completed")]
    # A block the CLI never took up (the session ended at the Stop) proves nothing.
    events = parse([payload("UserPromptSubmit", prompt="hi"), payload("Stop", tillerman=delivered),
                    payload("SessionEnd", turn=None, reason="other")])
    assert not [e for e in events if isinstance(e, UserMessage) and e.client_id]
    assert [e.status for e in events if isinstance(e, TurnCompleted)] == ["completed"]
    # A denied call never ran: declined at once; the turn's next event is our message.
    events = parse([payload("UserPromptSubmit", prompt="hi"),
                    payload("PreToolUse", tool_name="Bash", tool_input={"command": "grep"}, tool_use_id="t1",
                            tillerman=delivered),
                    payload("Stop", stop_hook_active=False)])
    assert [e.status for e in events if isinstance(e, ItemCompleted)] == ["declined"]
    assert [e.client_id for e in events if isinstance(e, UserMessage)] == [None, "tillerman-in-1"]


def test_a_hook_session_takes_a_queue_and_a_steer_for_the_next_tool_only() -> None:
    snapshot = ThreadSnapshot(thread_id=SESSION, hook_delivery=True, active_turn_id=PROMPT,
                              turn_states={PROMPT: "active"})
    owner = f"owner:{local_login()}"

    def decided(mode: str, **fields) -> tuple[Action, str]:
        intent = Intent(id="in-1", thread_id=SESSION, mode=mode, text="t", text_digest="sha256:0", created_at=0.0,
                        ack_deadline=60.0, expires_at=100.0, expected_turn_id=None if mode == "queue" else PROMPT,
                        producer=owner, **fields)
        decision = decide(intent, State.PROPOSED, snapshot, 1.0, load_effective(None, None).ruleset)
        return decision.action, decision.reason

    assert decided("queue") == (Action.QUEUE, "authorized")
    assert decided("steer", deliver_at="pre_tool_use") == (Action.STEER, "authorized")
    assert decided("steer") == (Action.ESCALATE, "not_steerable")  # no hook reaches a running model call
    assert decided("interrupt") == (Action.ESCALATE, "not_steerable")


def test_a_rules_steer_to_a_hook_session_is_for_its_next_tool_call() -> None:
    """A rule's steer (a budget's "wrap up") to a session reached only through its hooks
    asks for the next tool call, the one point a hook can steer at; else it is refused
    ``not_steerable`` and never reaches the agent."""
    ruleset = build_ruleset([Rule(id="spend", version=1, status="active", owner="me",
                                  review_by=datetime.date(2099, 1, 1), action="steer", text="Wrap up.",
                                  condition=Budget(measure="tokens", over=1000))],
                            (Grant(subject="rule:spend", actions=frozenset({"steer"})),), None)
    projection, step = Projection(), Step(ruleset, replay=False)
    spooled = parse([payload("SessionStart", turn=None), payload("UserPromptSubmit", prompt="hi")])
    usage = Usage(thread_id=SESSION, turn_id=PROMPT, source_kind="claude_transcript", model="m",
                  tokens=Tokens(input=1500, output=10), message_id="msg_1", request_id="req_1")
    for seq, event in enumerate([*spooled, usage], 1):
        projection.apply_envelope(Envelope(event_id=f"e{seq}", event=event, source="claude-hooks:s", at=1.0), seq)
    [proposed] = [e.event for e in step.step(projection, [SESSION], 1.0) if isinstance(e.event, IntentProposed)]
    assert (proposed.intent.expected_turn_id, proposed.intent.delivery_point) == (PROMPT, "pre_tool_use")
    decision = decide(proposed.intent, State.PROPOSED, projection.snapshot(SESSION), 1.0, ruleset)
    assert (decision.action, decision.reason) == (Action.STEER, "authorized")


def test_the_daemon_fills_the_outbox_and_settles_the_claim_from_the_spool(tmp_path: Path) -> None:
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    spool.mkdir()
    spooled = spool / f"{SESSION}.jsonl"
    spooled.write_text(json.dumps(payload("UserPromptSubmit", prompt="hi")) + "\n")
    intent = propose(ledger)
    outbox = outbox_path(spool, SESSION)

    async def run() -> None:
        with SQLiteRecorder(ledger) as recorder:
            daemon = Daemon(recorder, load_effective(None, None).ruleset, DaemonOptions(watch=(str(spool),)))
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                await until(outbox.exists)
                assert hook(spool, payload("Stop", stop_hook_active=False))["reason"] == intent.delivered_text
                await until(lambda: not outbox.exists())  # claimed: out of the outbox
                assert hook(spool, payload("Stop", stop_hook_active=True)) is None
                await until(lambda: state(ledger, intent.id).state is State.ACKNOWLEDGED)
                tg.cancel_scope.cancel()

    anyio.run(run)
    view = state(ledger, intent.id)
    assert [(h.state, h.reason) for h in view.history if h.kind == "transition"] == [
        ("dispatch_unknown", "dispatching"), ("acknowledged", "echo")]
    with SQLiteRecorder(ledger) as recorder:
        assert projections.load(recorder).snapshot(SESSION).hook_delivery


async def until(done, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not done():
            await anyio.sleep(0.02)


def test_propose_records_cancel_queued_and_deliver_at_only_where_they_apply(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger.sqlite3")
    base = ["intent", "propose", "--ledger", ledger, "--thread", SESSION, "--expected-turn", PROMPT, "--json"]
    result = CliRunner().invoke(main, [*base, "--mode", "interrupt", "--text", "stop", "--cancel-queued"])
    assert result.exit_code == 0, result.output
    intent_id = json.loads(result.output)["id"]
    assert state(Path(ledger), intent_id).intent.drops_queued
    result = CliRunner().invoke(main, [*base, "--mode", "steer", "--text", "t", "--deliver-at", "pre_tool_use"])
    assert state(Path(ledger), json.loads(result.output)["id"]).intent.delivery_point == "pre_tool_use"
    for wrong, says in ((["--mode", "queue", "--deliver-at", "pre_tool_use"], "--deliver-at applies to --mode steer"),
                        (["--mode", "steer", "--cancel-queued"], "--cancel-queued applies to --mode interrupt"),
                        (["--mode", "interrupt", "--cancel-queued", "--resume-queue"], "give one")):
        result = CliRunner().invoke(main, [*base, "--text", "t", *wrong])
        assert result.exit_code == 2 and says in result.output, result.output
    # An intent without them keeps the bytes it always had.
    assert b"cancel_queued" not in msgspec.json.encode(Intent(id="i", thread_id="t", mode="queue", text="t",
                                                              text_digest="d", created_at=0.0, ack_deadline=1.0,
                                                              expires_at=2.0))


# -- the documented setup: the session's transcript and its hook spool watched together --

UUID = "u-1"  # the transcript's id of the turn (its prompt line's uuid); PROMPT is the hooks'


def transcript_line(kind: str, **fields) -> dict:
    base = {"type": kind, "sessionId": SESSION, "cwd": "/ws", "timestamp": "2026-11-30T00:00:00.000Z"}
    return base | fields


PROMPT_LINE = transcript_line("user", uuid=UUID, promptId=PROMPT, message={"role": "user", "content": "hi"})
END_TURN = transcript_line("assistant", uuid="a-1", message={
    "role": "assistant", "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"})
STOP_SUMMARY = transcript_line("system", uuid="s-1", subtype="stop_hook_summary")


class Watched:
    """A daemon following a transcript folder and a hook spool, as README's command does."""

    def __init__(self, tmp_path: Path) -> None:
        self.ledger, self.spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
        projects = tmp_path / "projects"
        (projects / "-ws").mkdir(parents=True)
        self.spool.mkdir()
        self.transcript = projects / "-ws" / f"{SESSION}.jsonl"
        self.transcript.touch()
        (self.spool / f"{SESSION}.jsonl").touch()
        self.watch = (str(projects), str(self.spool))
        self.seen = 0  # ledger rows of the session's events so far

    def kinds(self) -> list[str]:
        with SQLiteRecorder(self.ledger) as recorder:
            return [type(e.envelope.event).__name__ for e in recorder.read() if e.envelope.event.thread_id == SESSION]

    async def append(self, target: str, line: dict, *, events: int) -> None:
        """Add a line to the transcript or the spool and wait for the daemon to record its events."""
        path = self.transcript if target == "transcript" else self.spool / f"{SESSION}.jsonl"
        with path.open("a") as out:
            out.write(json.dumps(line) + "\n")
        self.seen += events
        await until(lambda: len(self.kinds()) >= self.seen)

    async def hook(self, event: dict, *, events: int) -> dict | None:
        answer = await anyio.to_thread.run_sync(hook, self.spool, event)
        self.seen += events
        await until(lambda: len(self.kinds()) >= self.seen)
        return answer


def transitions(ledger: Path, intent_id: str) -> list[tuple[str, str]]:
    return [(h.state, h.reason) for h in state(ledger, intent_id).history if h.kind == "transition"]


def run_watched(tmp_path: Path, scenario) -> Watched:
    watched = Watched(tmp_path)

    async def run() -> None:
        with SQLiteRecorder(watched.ledger) as recorder:
            daemon = Daemon(recorder, load_effective(None, None).ruleset, DaemonOptions(watch=watched.watch))
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                await scenario(watched)
                tg.cancel_scope.cancel()

    anyio.run(run)
    return watched


def test_a_queued_intent_the_hook_delivers_is_acknowledged_though_the_transcript_ended_the_turn(tmp_path) -> None:
    """The README's command: the transcript's turn is the hooks' turn (its ``promptId``),
    and the transcript's end of it (the first ``end_turn``, before the Stop our hook
    blocks) does not end it while the hooks still run it: the claim settles from the
    spool's evidence, never ``expired: not_delivered``."""
    async def scenario(w: Watched) -> None:
        await w.append("spool", payload("UserPromptSubmit", prompt="hi"), events=3)  # thread, turn, message
        await w.append("transcript", PROMPT_LINE, events=4)  # thread, alias, turn, message
        intent = propose(w.ledger)
        outbox = outbox_path(w.spool, SESSION)
        await until(outbox.exists)
        await w.append("transcript", END_TURN, events=2)  # the agent's message, the turn's end
        assert (await w.hook(payload("Stop", stop_hook_active=False), events=0))["reason"] == intent.delivered_text
        await w.append("transcript", STOP_SUMMARY, events=0)
        await anyio.sleep(0.5)  # rounds enough for a verdict the transcript alone would give
        assert state(w.ledger, intent.id).state is State.DISPATCH_UNKNOWN, transitions(w.ledger, intent.id)
        await w.hook(payload("Stop", stop_hook_active=True), events=2)  # our message, the turn's end
        await until(lambda: state(w.ledger, intent.id).state is State.ACKNOWLEDGED)
        w.intent = intent

    w = run_watched(tmp_path, scenario)
    assert transitions(w.ledger, w.intent.id) == [("dispatch_unknown", "dispatching"), ("acknowledged", "echo")]
    with SQLiteRecorder(w.ledger) as recorder:
        thread = projections.load(recorder).threads[SESSION]
    assert thread.turn_states == {PROMPT: "completed"} and thread.turn_state(UUID) == "completed"


@pytest.mark.parametrize("first", ["spool", "transcript"])
def test_a_steer_for_the_active_turn_is_delivered_at_the_hooks_pre_tool_use(tmp_path, first: str) -> None:
    """``--expected-turn active`` names the turn by whichever id the ledger saw first; the
    hook, which knows it by ``prompt_id``, finds it under either (the outbox carries
    both), denies the next tool with the text and the spool's next event acknowledges it."""
    async def scenario(w: Watched) -> None:
        lines = {"spool": (payload("UserPromptSubmit", prompt="hi"), 3), "transcript": (PROMPT_LINE, 4)}
        for target in (first, *({"spool", "transcript"} - {first})):
            line, events = lines[target]
            await w.append(target, line, events=events)
        steer = propose(w.ledger, mode="steer", text="Use rg, not grep.", expected_turn="active",
                        deliver_at="pre_tool_use")
        assert steer.expected_turn_id == (PROMPT if first == "spool" else UUID)
        await until(outbox_path(w.spool, SESSION).exists)
        tool = {"tool_name": "Bash", "tool_input": {"command": "grep -r x"}, "tool_use_id": "toolu_1"}
        answer = await w.hook(payload("PreToolUse", **tool), events=2)  # the call, declined
        assert answer["hookSpecificOutput"]["permissionDecisionReason"] == steer.delivered_text
        await w.hook(payload("Stop", stop_hook_active=False), events=2)  # our message, the turn's end
        await until(lambda: state(w.ledger, steer.id).state is State.ACKNOWLEDGED)
        w.intent = steer

    w = run_watched(tmp_path, scenario)
    assert transitions(w.ledger, w.intent.id) == [("dispatch_unknown", "dispatching"), ("acknowledged", "echo")]


def test_status_shows_what_each_thread_takes_and_through_what(tmp_path: Path) -> None:
    """A hook session is not steerable, yet it takes a queue and a steer for the next
    tool: status says so from the policy's own ``capabilities``, for every transport."""
    ledger = tmp_path / "ledger.sqlite3"
    seen = {"hooks": ("file:/spool/h.jsonl", "claude-hooks"), "wrapper": ("claude-wrapper:run-1", None),
            "codex": ("appserver:ws://x", None), "files": ("file:/p/t.jsonl", "claude-transcript")}
    with SQLiteRecorder(ledger) as recorder:
        recorder.append([Envelope(event_id=f"e-{thread}", event=ThreadStarted(thread_id=thread, source_format=fmt),
                                  source=source) for thread, (source, fmt) in seen.items()])
        projection = projections.load(recorder)
    result = CliRunner().invoke(main, ["status", "--ledger", str(ledger), "--json"])
    assert result.exit_code == 0, result.output
    shown = {t["thread"]: (t["takes"], t["via"], t["steerable"]) for t in json.loads(result.output)["threads"]}
    assert shown == {"hooks": (["queue", "steer@pre_tool_use"], "claude-hooks", False),
                     "wrapper": (["steer", "queue", "interrupt"], "claude-wrapper", True),
                     "codex": (["steer", "queue", "interrupt", "stop"], "app-server", True),
                     "files": ([], None, False)}
    for thread in seen:  # what status lists is what the policy lets through
        snapshot = projection.snapshot(thread)
        for mode, fields in (("steer", {}), ("steer", {"deliver_at": "pre_tool_use"}), ("queue", {}),
                             ("interrupt", {}), ("stop", {})):
            intent = Intent(id="i", thread_id=thread, mode=mode, text="t", text_digest="d", created_at=0.0,
                            ack_deadline=1.0, expires_at=2.0, **fields)
            form = "steer@pre_tool_use" if fields and "steer" not in capabilities(snapshot) else mode
            assert takes(intent, snapshot) == (form in shown[thread][0])
    text = CliRunner().invoke(main, ["status", "--ledger", str(ledger)]).output
    assert [line.split()[:3] for line in text.splitlines() if line.startswith(tuple(seen))] == [
        ["codex", "steer,queue,interrupt,stop", "app-server"], ["files", "-", "files"],
        ["hooks", "queue,steer@pre_tool_use", "claude-hooks"], ["wrapper", "steer,queue,interrupt", "claude-wrapper"]]


# -- a deny the CLI did not honour is evidence against delivery -----------------------

DENIED = {"tool_name": "Bash", "tool_input": {"command": "grep -r x"}, "tool_use_id": "toolu_1"}


@pytest.mark.parametrize("ran", ["PostToolUse", "PostToolUseFailure"])
def test_the_denied_call_ending_is_no_echo_but_a_deny_not_honoured(ran: str) -> None:
    """The call our PreToolUse hook denied reports its own end: it ran, so the model got
    its output instead of our text. Neither that event nor any later one of the turn
    reads as our message; a later call's events still would have, had the deny held."""
    delivered = {"delivered": "in-1", "attempt": "a", "text": "Use rg, not grep."}
    events = parse([payload("UserPromptSubmit", prompt="hi"), payload("PreToolUse", tillerman=delivered, **DENIED),
                    payload(ran, tool_response={"stdout": "x"}, **DENIED),
                    payload("PreToolUse", **(DENIED | {"tool_use_id": "toolu_2"})),
                    payload("Stop", stop_hook_active=False)])
    assert not [e for e in events if isinstance(e, UserMessage) and e.client_id]
    refuted = [e for e in events if isinstance(e, DenyNotHonoured)]
    assert [(e.client_id, e.item_id, e.turn_id, e.status) for e in refuted] == [
        ("tillerman-in-1", "toolu_1", PROMPT, "failed" if ran == "PostToolUseFailure" else "completed")]
    # Another call's end after the deny is neither: the turn's Stop proves the deny held.
    events = parse([payload("UserPromptSubmit", prompt="hi"), payload("PreToolUse", tillerman=delivered, **DENIED),
                    payload("PostToolUse", tool_response={}, **(DENIED | {"tool_use_id": "toolu_2"})),
                    payload("Stop", stop_hook_active=False)])
    assert [e.client_id for e in events if isinstance(e, UserMessage)] == [None, "tillerman-in-1"]
    assert not [e for e in events if isinstance(e, DenyNotHonoured)]


def call(tool_use_id: str, **fields) -> dict:
    return DENIED | {"tool_use_id": tool_use_id, "tool_input": {"command": f"echo {tool_use_id}"}} | fields


#: How Claude Code 2.1.332 fired the hooks of one model message asking for three Bash
#: calls, our hook denying the first in line (recorded with the real CLI): read-only
#: commands run at once (the siblings' PreToolUse before and after the deny, their
#: PostToolUse after it), others one after another (a sibling's whole call after it).
#: The model got every result, our text among them, in one call after the last of them.
PARALLEL_ORDERS = {
    "at-once": [("PreToolUse", "t2", False), ("PreToolUse", "t1", True), ("PreToolUse", "t3", False),
                ("PostToolUse", "t2", False), ("PostToolUse", "t3", False)],
    "in-turn": [("PreToolUse", "t0", False), ("PostToolUse", "t0", False), ("PreToolUse", "t1", True),
                ("PreToolUse", "t3", False), ("PostToolUse", "t3", False)],
}


@pytest.mark.parametrize("order", PARALLEL_ORDERS)
def test_a_deny_among_parallel_calls_is_proven_by_the_stop_not_by_a_sibling_call(order: str) -> None:
    """The calls of the denied call's own model message fire their hooks after our deny,
    before the model has been called with it: none of them is proof; the Stop (the
    model's answer to every result) is. Each sibling event was read as the echo before."""
    delivered = {"delivered": "in-1", "attempt": "a", "text": "Use rg, not grep."}
    lines = [payload("UserPromptSubmit", prompt="hi")]
    for name, tool_use_id, ours in PARALLEL_ORDERS[order]:
        extra = {"tillerman": delivered} if ours else {"tool_response": {"stdout": "x"}} if name == "PostToolUse" else {}
        lines.append(payload(name, **call(tool_use_id, **extra)))
    siblings = parse(lines)
    assert not [e for e in siblings if isinstance(e, UserMessage) and e.client_id]
    assert not [e for e in siblings if isinstance(e, DenyNotHonoured)]
    proven = parse([*lines, payload("Stop", stop_hook_active=False)])
    ours = [e for e in proven if isinstance(e, UserMessage) and e.client_id]
    assert [(e.client_id, e.turn_id) for e in ours] == [("tillerman-in-1", PROMPT)]
    assert [e.status for e in proven if isinstance(e, TurnCompleted)] == ["completed"]


def test_two_parallel_calls_each_denied_for_a_steer_are_both_proven_at_the_stop() -> None:
    """Two PreToolUse hooks of one message may each deliver a steer: the second deny does
    not drop the first (it did: one delivery was kept), and a sibling's run is no proof."""
    first = {"delivered": "in-1", "attempt": "a", "text": "one"}
    second = {"delivered": "in-2", "attempt": "b", "text": "two"}
    lines = [payload("UserPromptSubmit", prompt="hi"), payload("PreToolUse", **call("t1", tillerman=first)),
             payload("PreToolUse", **call("t2", tillerman=second)),
             payload("PreToolUse", **call("t3")), payload("PostToolUse", **call("t3", tool_response={}))]
    assert not [e for e in parse(lines) if isinstance(e, UserMessage) and e.client_id]
    proven = parse([*lines, payload("Stop", stop_hook_active=False)])
    assert [e.client_id for e in proven if isinstance(e, UserMessage) and e.client_id] == [
        "tillerman-in-1", "tillerman-in-2"]


def test_a_steer_whose_deny_was_not_honoured_expires_saying_so(tmp_path: Path) -> None:
    """The claim, then the denied call running anyway, then the turn going on and ending
    with a Stop (which alone would have acknowledged it): expired deny_not_honoured."""
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    steer = propose(ledger, mode="steer", text="Use rg, not grep.", expected_turn=PROMPT, deliver_at="pre_tool_use")
    fill_outbox(spool, ledger, steer)
    hook(spool, payload("UserPromptSubmit", prompt="hi"))
    assert hook(spool, payload("PreToolUse", **DENIED))["hookSpecificOutput"]["permissionDecision"] == "deny"
    hook(spool, payload("PostToolUse", tool_response={"stdout": "x"}, **DENIED))
    hook(spool, payload("Stop", stop_hook_active=False))
    moves = settled(spool, ledger, steer)
    assert [(m.event.to_state, m.event.reason, m.event.evidence["tool_use_id"]) for m in moves] == [
        ("expired", "deny_not_honoured", "toolu_1")]


def settled(spool: Path, ledger: Path, intent: Intent) -> list[Envelope]:
    """What ``settle`` decides for the intent from the spool as it is now (read afresh)."""
    source = f"file:{spool / f'{SESSION}.jsonl'}"
    with SQLiteRecorder(ledger) as recorder:
        recorder.append([Envelope(event_id=f"h-{i}", event=e, source=source)
                         for i, e in enumerate(parse(spool_lines(spool)))])
        projection = projections.load(recorder)
    return settle(projection, projection.intents[intent.id], 10.0)


def test_a_steer_denied_among_parallel_calls_is_acknowledged_only_at_the_stop(tmp_path: Path) -> None:
    """The claim at the first call's PreToolUse, then its siblings' hooks (as the real CLI
    fires them for read-only commands): nothing settles; the Stop acknowledges it."""
    ledger, spool = tmp_path / "ledger.sqlite3", tmp_path / "spool"
    steer = propose(ledger, mode="steer", text="Use rg, not grep.", expected_turn=PROMPT, deliver_at="pre_tool_use")
    fill_outbox(spool, ledger, steer)
    hook(spool, payload("UserPromptSubmit", prompt="hi"))
    assert hook(spool, payload("PreToolUse", **call("t1")))["hookSpecificOutput"]["permissionDecision"] == "deny"
    hook(spool, payload("PreToolUse", **call("t2")))
    hook(spool, payload("PostToolUse", **call("t2", tool_response={"stdout": "x"})))
    assert settled(spool, ledger, steer) == []
    hook(spool, payload("Stop", stop_hook_active=False))
    assert [(m.event.to_state, m.event.reason) for m in settled(spool, ledger, steer)] == [("acknowledged", "echo")]


def test_the_files_line_of_status_agrees_with_takes() -> None:
    """A daemon following a hook spool: its sessions take queued messages and
    pre_tool_use steers (TAKES), so the line about the followed folders must not call
    every thread read from files unsteerable."""
    daemon = {"running": True, "pid": 1, "since": "t0", "heartbeat": "t1", "watch": ["/spool"], "watch_waiting": []}
    [line] = [line for line in _daemon_lines(daemon) if line.startswith("files:")]
    assert "/spool" in line and "TAKES" in line and "not steerable" not in line


@pytest.mark.parametrize("first", ["hook", "wrapper"])
def test_a_hook_and_the_wrapper_never_both_claim_one_intent(tmp_path: Path, first: str) -> None:
    """Hooks installed user-wide and ``tillerman claude`` on one session: each claims with
    the same durable ``proposed → dispatch_unknown`` record before it delivers, and the
    ledger takes exactly one; the other delivers nothing."""
    ledger = tmp_path / "ledger.sqlite3"
    intent = propose(ledger)

    def wrapper_claims() -> bool:
        with SQLiteRecorder(ledger) as recorder:
            record = intents.transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching",
                                                 {"attempt": "w", "mode": "queue"}, 1.0)
            try:
                return not recorder.append([record], durable=True).conflicts
            except IllegalTransition:
                return False

    def hook_claims() -> bool:
        return hook_claim.claim(str(ledger), intent.id, event="Stop", turn_id=PROMPT).claimed

    claims = [hook_claims(), wrapper_claims()] if first == "hook" else [wrapper_claims(), hook_claims()]
    assert claims == [True, False]
    assert [h.state for h in state(ledger, intent.id).history if h.kind == "transition"] == ["dispatch_unknown"]
