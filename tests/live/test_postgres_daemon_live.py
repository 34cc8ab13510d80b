"""The daemon on a PostgreSQL ledger, on the REAL app-server: a steer proposed by another
process (``tillerman intent propose --ledger postgresql://…``) wakes the daemon through
LISTEN/NOTIFY — there is no file to watch — and lands once, in its turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import SETTLED, ruleset_from, session, wait_until
from tests.live.test_daemon_live import NO_RULES, OWNER, OWNER_GRANT, our_echoes
from tests.live.test_proposal_pickup_live import PICKUP_BOUND, held
from tillerman.ledger.changes import ChangeFeed
from tillerman.ledger.events import DecisionRecorded, IntentProposed
from tillerman.ledger.postgres import PostgresRecorder

pytestmark = [pytest.mark.live, pytest.mark.anyio]


class SpiedFeed(ChangeFeed):
    """A change feed that notes each seq it tells of: the commits the daemon is woken for."""

    def __init__(self, feed: ChangeFeed, heard: list[int]) -> None:
        self._feed, self._heard = feed, heard

    async def __aiter__(self) -> AsyncIterator[int | None]:
        async for seq in self._feed:
            if seq is not None:
                self._heard.append(seq)
            yield seq

    def close(self) -> None:
        self._feed.close()

ROOT = Path(__file__).resolve().parents[2]


def propose(dsn: str, thread: str, turn: str) -> dict:
    """``tillerman intent propose`` in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "tillerman", "intent", "propose", "--ledger", dsn, "--thread", thread,
         "--expected-turn", turn, "--mode", "steer", "--owner", OWNER, "--text", "PG STEER: note this.", "--json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_a_steer_proposed_elsewhere_wakes_the_daemon_on_postgresql_and_lands_once(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path, postgres_dsn: str
) -> None:
    release = tmp_path / "release"
    hold = f"WAIT: {release}"
    recorder, notified = PostgresRecorder(postgres_dsn), []
    feed_of = recorder.change_feed
    recorder.change_feed = lambda: SpiedFeed(feed_of(), notified)
    async with session(app_server, tmp_path, recorder) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        try:
            thread = await s.start_thread(workspace)
            turn = await s.start_turn(thread, hold)
            await wait_until(lambda: len(held(scripted_model, hold)) == 1, "the model to hold the turn", timeout=60)
            await wait_until(lambda: s.projection().snapshot(thread).active_turn_id == turn,
                             "the daemon to see the turn active", timeout=30)
            # The held turn gives the daemon nothing to wake on: only the notification does.
            intent_id = (await anyio.to_thread.run_sync(propose, postgres_dsn, thread, turn))["id"]
            await wait_until(lambda: s.intent(intent_id).state in SETTLED | {"queued"},
                             "the steer to reach its turn", timeout=60)
        finally:
            release.touch()
        await wait_until(lambda: s.intent(intent_id).state in SETTLED, "the steer to settle", timeout=60)
        assert s.intent(intent_id).state == "acknowledged"
        entries = s.entries()
        proposed_at = next(e.envelope.at for e in entries if isinstance(e.envelope.event, IntentProposed))
        decided_at = next(e.envelope.at for e in entries
                          if isinstance(e.envelope.event, DecisionRecorded) and e.envelope.event.intent_id == intent_id)
        proposal_seq = next(e.seq for e in entries if isinstance(e.envelope.event, IntentProposed))
        assert any(seq >= proposal_seq for seq in notified)  # the other process's commit woke the daemon
        assert decided_at - proposed_at <= PICKUP_BOUND
        echoes = our_echoes(s, s.intent(intent_id).intent.client_user_message_id)
        assert [(e["threadId"], e["turnId"]) for e in echoes] == [(thread, turn)]
        assert s.recorder.verify().ok
