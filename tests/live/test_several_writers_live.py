"""Several writers on one thread (against the real app-server; docs/goals.md "Several
writers").

Another client (the harness, as an IDE would) opens a turn and steers into it: tillerman
records both messages as another writer's, the steer as input folded into a running turn,
and holds its own steer (a decision with the reason ``other_writer_input``) until the
agent answered that input; then its steer goes, to a turn that started after its
proposal, and lands once (counted from the server's history).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.torture import server_copies, thread_turns
from tests.live.daemon_support import OWNER, OWNER_GRANT, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import DecisionRecorded
from tillerman.ledger.projections import ThreadState
from tillerman.ledger.writers import OTHER
from tillerman.monitor import codex_wire as wire

pytestmark = [pytest.mark.live, pytest.mark.anyio]

IDE_STEER = "ide-steer-1"  # the other client's own clientUserMessageId
_NONE = ThreadState(thread_id="")


async def test_another_clients_turn_and_steer_are_recorded_as_another_writers(app_server, workspace, tmp_path: Path):
    async with session(app_server, tmp_path) as s:
        thread = await s.start_thread(workspace)
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        # The daemon subscribes to the thread at its first turn; from then on it sees each
        # turn from its start, its opening message included.
        opening = await s.start_turn(thread, "hello")
        await s.turn_completed(thread, opening)
        await wait_until(lambda: opening in s.projection().threads.get(thread, _NONE).turn_states,
                         "the daemon to follow the thread")
        first_gate, second_gate = workspace / "release-first", workspace / "release-second"
        turn = await s.start_turn(thread, f"WAIT: {first_gate}")
        await wait_until(lambda: turn in s.projection().threads[thread].turn_writers, "the daemon to see the turn open")
        # The other client steers into its own running turn; the model reads it at its next call.
        await s.harness.request(*wire.steer(thread, turn, IDE_STEER, "RUN: sleep 3"))
        first_gate.touch()
        await wait_until(lambda: s.projection().snapshot(thread).other_writer_input,
                         "tillerman to see the other writer's message folded into the turn")

        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn="active", mode="steer",
                                         owner=OWNER, text="also keep the changelog")
        await wait_until(lambda: any(d.intent_id == intent.id and d.reason == "other_writer_input"
                                     for d in s.events(DecisionRecorded)), "tillerman to hold its steer")
        assert s.intent(intent.id).state == "proposed"
        await s.turn_completed(thread, turn, timeout=30)  # the agent answered the other writer, the turn ended

        later = await s.start_turn(thread, f"WAIT: {second_gate}")  # the person's next turn
        # Accepted into that turn; the echo comes when the model reads it (0.153.4: at its
        # next call, after the held one).
        await s.wait_state(intent.id, {"queued", "acknowledged"}, timeout=30)
        second_gate.touch()
        view = await s.wait_state(intent.id, {"acknowledged"}, timeout=30)
        await s.turn_completed(thread, later, timeout=30)
        state = s.projection().threads[thread]
        copies = server_copies(await thread_turns(s.harness, thread))

    assert state.turn_writers[turn] == OTHER and state.turn_writers[later] == OTHER
    folded = [f for f in state.writer_facts if f.kind == "input_folded"]
    assert [f.turn_id for f in folded] == [turn]
    assert copies[IDE_STEER] == [turn]
    assert copies[intent.client_user_message_id] == [later]
    assert [h.evidence.get("turn_id") for h in view.history if h.kind == "transition" and h.state == "acknowledged"] \
        == [later]
