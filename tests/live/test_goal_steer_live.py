"""A steer for the thread's current work lands once on short goal turns (against the real
app-server; docs/goals.md "Steering a moving target").

A goal thread runs turns of a few tens of milliseconds (the scripted model answers a
continuation at once), the next starting 5-10 ms after the last ends: a steer proposed for
``--expected-turn active`` names a turn that is usually over by the time it is sent. Each
of ``STEERS`` steers is proposed at a random moment (inside a turn or between two) and
must land exactly once, in the turn its proposal named or in one that started after the
proposal: counted from the server's own history (``thread/turns/list`` with every item,
as ``tests/faults/torture.py`` judges), never from tillerman's ledger alone.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import anyio
import pytest

from tests.faults.torture import server_copies, thread_turns
from tests.live.daemon_support import OWNER, OWNER_GRANT, SETTLED, ruleset_from, session, wait_until
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import TurnStarted
from tillerman.monitor.jsonrpc import RpcError

pytestmark = [pytest.mark.live, pytest.mark.anyio]

STEERS = 20
GOAL = {"objective": "keep the notes in order", "status": "active", "origin": "user"}


async def test_steers_for_the_active_turn_land_once_on_short_goal_turns(app_server, workspace, tmp_path: Path):
    rng = random.Random(34)
    async with session(app_server, tmp_path) as s:
        thread = await s.start_thread(workspace)
        gate = workspace / "release-first-turn"
        first = await s.start_turn(thread, f"WAIT: {gate}")
        await s.start_daemon(ruleset_from(tmp_path, "", OWNER_GRANT))
        await wait_until(lambda: s.projection().snapshot(thread).active_turn_id == first, "the daemon to see the turn")
        try:
            await s.harness.request("thread/goal/set", {"threadId": thread, **GOAL})
        except RpcError as exc:
            pytest.skip(f"this app-server has no thread goals ({exc})")
        gate.touch()  # the first turn ends; Codex starts the goal's turns one after another
        try:
            await wait_until(lambda: sum(1 for e in s.events(TurnStarted) if e.thread_id == thread) >= 4,
                             "goal turns to run", timeout=15)
        except AssertionError:
            pytest.skip("this app-server starts no goal continuation turns (Codex 0.171 does)")

        intents = []
        for number in range(STEERS):
            await anyio.sleep(rng.uniform(0.0, 0.06))  # inside a turn, or in the gap between two
            intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn="active", mode="steer",
                                             owner=OWNER, text=f"note {number}: keep the list sorted")
            intents.append(intent)
            await s.wait_state(intent.id, SETTLED, timeout=60)

        await s.harness.request("thread/goal/set", {"threadId": thread, **GOAL, "status": "paused"})
        await wait_until(lambda: s.projection().snapshot(thread).active_turn_id is None, "the goal's turns to stop",
                         timeout=30)
        copies = server_copies(await thread_turns(s.harness, thread))
        projection = s.projection()
        started_seq = {e.envelope.event.turn_id: e.seq for e in s.entries()
                       if isinstance(e.envelope.event, TurnStarted) and e.envelope.event.thread_id == thread}

    outcomes, retargets, older, landed_in_named = Counter(), [], [], 0
    for intent in intents:
        view = projection.intents[intent.id]
        outcomes[f"{view.state} {view.history[-1].reason}"] += 1
        turns = copies.get(intent.client_user_message_id, [])
        assert len(turns) == 1, f"intent {intent.id}: {len(turns)} copies on the server ({turns})"
        proposed_at = view.history[0].seq
        if turns[0] == intent.expected_turn_id:
            landed_in_named += 1
        elif started_seq.get(turns[0], 0) <= proposed_at:
            older.append((intent.id, turns[0]))
        retargets.append(sum(1 for h in view.history if h.kind == "evidence" and h.reason == "retargeted"))
    print(f"\n{STEERS} steers: {dict(outcomes)}; landed in the turn the proposal named: {landed_in_named}; "
          f"retargets per steer: {sorted(retargets)}; proposals between turns: "
          f"{sum(1 for i in intents if i.expected_turn_id is None)}")
    # 0 refused for a replaced turn (stale_turn, no_active_turn), 0 expired turn_ended
    assert set(outcomes) <= {"acknowledged echo", "acknowledged readback_found"}, outcomes
    assert older == [], f"landed in a turn that started before the proposal: {older}"
