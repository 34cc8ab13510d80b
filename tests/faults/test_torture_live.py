"""Random kills and turn rollover races against the REAL app-server (see
``tests.faults.torture``).

* Random kills: rounds of a live session — a turn, 1–3 random intents (steer, queue,
  interrupt) at random moments, or (one round in five, on Codex 0.171) a goal thread and
  a stop, and a SIGKILL of the daemon from outside at a random
  moment or from inside at a random checkpoint, then a restart. After each round:
  nothing delivered twice, nothing lost without a report, no steer on a wrong turn, the
  ledger's verdict matches the server's history, ``ledger verify`` and
  ``PRAGMA integrity_check`` pass.
* Turn rollover races: the expected turn ends at a varied moment around the steer and
  the next turn starts at once; zero steers land on another turn, and every refusal is
  reconciled (rejected stale_turn / no_active_turn, or expired turn_ended /
  not_delivered / lost_after_accept), or the steer is acknowledged in its own turn.

The seed is printed (``-s`` shows it); set ``TILLERMAN_TORTURE_SEED`` to replay one,
``TILLERMAN_TORTURE_ROUNDS`` / ``TILLERMAN_TORTURE_RACES`` for the slow counts.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from fixtures.codex_server import AppServer, HarnessClient, watched_connection
from tests.faults.torture import DaemonProcess, Harness, reconciled, rollover_trial, run_rounds

pytestmark = [pytest.mark.live, pytest.mark.anyio]


def _seed() -> int:
    seed = int(os.environ.get("TILLERMAN_TORTURE_SEED") or random.SystemRandom().randrange(2**32))
    print(f"torture seed {seed} (replay: TILLERMAN_TORTURE_SEED={seed})")
    return seed


async def _random_kills(app_server: AppServer, workspace: Path, tmp_path: Path, rounds: int) -> None:
    daemon = DaemonProcess(app_server.url, tmp_path)
    async with watched_connection(app_server.url, client_name="harness",
                                  client_class=HarnessClient) as (client, log):
        h = Harness(app_server, client, log, daemon)
        try:
            summary = await run_rounds(h, rounds, _seed(), workspace, progress=print)
        finally:
            daemon.stop()
    print(summary.table())
    counts = summary.counts()
    assert counts["intents proposed"] >= rounds
    assert summary.clean, summary.table()


async def test_random_kills_a_few_rounds(app_server: AppServer, workspace: Path, tmp_path: Path) -> None:
    await _random_kills(app_server, workspace, tmp_path, rounds=4)


@pytest.mark.slow
async def test_random_kills_many_rounds(app_server: AppServer, workspace: Path, tmp_path: Path) -> None:
    await _random_kills(app_server, workspace, tmp_path, rounds=int(os.environ.get("TILLERMAN_TORTURE_ROUNDS", 60)))


async def _races(app_server: AppServer, workspace: Path, tmp_path: Path, trials: int) -> None:
    daemon = DaemonProcess(app_server.url, tmp_path)
    rng = random.Random(_seed())
    async with watched_connection(app_server.url, client_name="harness",
                                  client_class=HarnessClient) as (client, log):
        h = Harness(app_server, client, log, daemon)
        daemon.start()
        try:
            thread = await h.start_thread(workspace)
            outcomes = [await rollover_trial(h, rng, n, workspace, thread=thread) for n in range(trials)]
        finally:
            assert daemon.stop() == 0, daemon.stderr_tail()
    print(Counter(f"{o.state}/{o.reason}" for o in outcomes))
    assert not [o.describe() for o in outcomes if o.wrong_turn]
    assert not [o.describe() for o in outcomes if not reconciled(o) or o.problems]


async def test_turn_rollover_races_a_few_trials(app_server: AppServer, workspace: Path, tmp_path: Path) -> None:
    await _races(app_server, workspace, tmp_path, trials=6)


@pytest.mark.slow
async def test_turn_rollover_races_many_trials(app_server: AppServer, workspace: Path, tmp_path: Path) -> None:
    await _races(app_server, workspace, tmp_path, trials=int(os.environ.get("TILLERMAN_TORTURE_RACES", 60)))
