"""Several writers on one thread (against the real app-server; docs/goals.md "Several
writers").

Another client (the harness, as an IDE would) opens a turn and steers into it: tillerman
records both messages as another writer's, the steer as input folded into a running turn,
and holds its own steer (a decision with the reason ``other_writer_input``) while the
model has not answered that input. Where the steer goes then depends on how the turn goes
on, and each test pins one way down (the model's answer and the turn's end are ordered by
the script, not by timing):

* the agent answers the other writer and works on in the same turn: tillerman's steer
  goes into that turn, after the answer;
* the turn ends without an answer (the other writer interrupts it): the steer goes into
  the person's next turn, which started after its proposal.

Either way it lands once (counted from the server's history).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.faults.torture import server_copies, thread_turns
from tests.live.daemon_support import OWNER, OWNER_GRANT, Session, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import AgentMessage, DecisionRecorded, UserMessage
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import ThreadState
from tillerman.ledger.writers import OTHER
from tillerman.monitor import codex_wire as wire

pytestmark = [pytest.mark.live, pytest.mark.anyio]

IDE_STEER = "ide-steer-1"  # the other client's own clientUserMessageId
_NONE = ThreadState(thread_id="")


def wait_for_file(path: Path) -> str:
    """A shell command that runs until ``path`` exists (the turn works until the test says)."""
    return f"while [ ! -e {shlex.quote(str(path))} ]; do sleep 0.05; done"


async def other_writers_steered_turn(s: Session, workspace: Path, steer_text: str) -> tuple[str, str]:
    """A thread the daemon follows, with another client's running turn that the client
    steered ``steer_text`` into; returns the thread and the turn once tillerman saw the
    steer folded in."""
    thread = await s.start_thread(workspace)
    await s.start_daemon(ruleset_from(s.tmp_path, "", OWNER_GRANT))
    # The daemon subscribes to the thread at its first turn; from then on it sees each
    # turn from its start, its opening message included.
    opening = await s.start_turn(thread, "hello")
    await s.turn_completed(thread, opening)
    await wait_until(lambda: opening in s.projection().threads.get(thread, _NONE).turn_states,
                     "the daemon to follow the thread")
    first_gate = workspace / "release-first"
    turn = await s.start_turn(thread, f"WAIT: {first_gate}")
    await wait_until(lambda: turn in s.projection().threads[thread].turn_writers, "the daemon to see the turn open")
    # The other client steers into its own running turn. 0.171.0 abandons the held model
    # call for it; 0.153.4 reads it at the model's next call, after the held one answers.
    await s.harness.request(*wire.steer(thread, turn, IDE_STEER, steer_text))
    first_gate.touch()
    await wait_until(lambda: s.projection().snapshot(thread).other_writer_input,
                     "tillerman to see the other writer's message folded into the turn")
    return thread, turn


async def held_steer(s: Session, thread: str) -> Intent:
    """tillerman's steer for the running turn, proposed while the model has not answered
    the other writer (its script holds the reply): held, and recorded why."""
    intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn="active", mode="steer",
                                     owner=OWNER, text="also keep the changelog")
    await wait_until(lambda: any(d.intent_id == intent.id and d.reason == "other_writer_input"
                                 for d in s.events(DecisionRecorded)), "tillerman to hold its steer")
    assert s.intent(intent.id).state == "proposed"
    return intent


def assert_other_writers_turn(state: ThreadState, copies: dict[str, list[str]], turn: str) -> None:
    """The other client opened ``turn`` and its steer was folded into it, once."""
    assert state.turn_writers[turn] == OTHER
    assert [f.turn_id for f in state.writer_facts if f.kind == "input_folded"] == [turn]
    assert copies[IDE_STEER] == [turn]


def acknowledged_in(view) -> list[str | None]:
    return [h.evidence.get("turn_id") for h in view.history if h.kind == "transition" and h.state == "acknowledged"]


async def test_a_steer_held_for_another_writers_message_goes_into_the_turn_once_the_agent_answered(
        app_server, workspace, tmp_path: Path):
    async with session(app_server, tmp_path) as s:
        answered, worked = workspace / "release-answer", workspace / "release-work"
        # The model stays silent on the other writer's message until `answered` exists,
        # then answers it and runs a command until `worked` exists: the turn goes on.
        thread, turn = await other_writers_steered_turn(
            s, workspace, f"ANSWER_THEN_RUN: {answered} {wait_for_file(worked)}")
        intent = await held_steer(s, thread)
        answered.touch()
        # Sent into the running turn; Codex echoes it at the model's next call, once the
        # command is over.
        await s.wait_state(intent.id, {"queued", "acknowledged"}, timeout=30)
        worked.touch()
        view = await s.wait_state(intent.id, {"acknowledged"}, timeout=30)
        await s.turn_completed(thread, turn, timeout=30)
        state = s.projection().threads[thread]
        copies = server_copies(await thread_turns(s.harness, thread))
        entries = s.entries()

    assert_other_writers_turn(state, copies, turn)
    assert copies[intent.client_user_message_id] == [turn]
    assert acknowledged_in(view) == [turn]
    # Decided only after the ledger held the agent's answer to the other writer.
    folded_at = next(e.seq for e in entries if isinstance(e.envelope.event, UserMessage)
                     and e.envelope.event.client_id == IDE_STEER)
    answered_at = next(e.seq for e in entries if isinstance(e.envelope.event, AgentMessage)
                       and e.envelope.event.turn_id == turn and e.seq > folded_at)
    sent_at = next(e.seq for e in entries if isinstance(e.envelope.event, DecisionRecorded)
                   and e.envelope.event.intent_id == intent.id and e.envelope.event.action == "steer")
    assert folded_at < answered_at < sent_at


async def test_a_steer_held_until_the_turn_ended_unanswered_goes_into_the_persons_next_turn(
        app_server, workspace, tmp_path: Path):
    async with session(app_server, tmp_path) as s:
        # The model never answers the other writer's message (its file is never made).
        thread, turn = await other_writers_steered_turn(s, workspace, f"WAIT: {workspace / 'never'}")
        intent = await held_steer(s, thread)
        await s.harness.request(*wire.interrupt(thread, turn))  # the other writer ends its turn
        assert await s.turn_completed(thread, turn, timeout=30) == "interrupted"

        later_gate = workspace / "release-later"
        later = await s.start_turn(thread, f"WAIT: {later_gate}")  # the person's next turn
        # Accepted into that turn; the echo comes when the model reads it (0.153.4: at its
        # next call, after the held one).
        await s.wait_state(intent.id, {"queued", "acknowledged"}, timeout=30)
        later_gate.touch()
        view = await s.wait_state(intent.id, {"acknowledged"}, timeout=30)
        await s.turn_completed(thread, later, timeout=30)
        state = s.projection().threads[thread]
        copies = server_copies(await thread_turns(s.harness, thread))

    assert_other_writers_turn(state, copies, turn)
    assert state.turn_writers[later] == OTHER
    assert copies[intent.client_user_message_id] == [later]
    assert acknowledged_in(view) == [later]
