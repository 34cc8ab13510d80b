"""Proposals from many processes at once are each picked up at once, on the REAL app-server.

Several threads each hold a turn open in a silent model call (the scripted model's
``WAIT``: nothing happens on the thread until a steer arrives or the test releases it); a
steer for each is proposed at the same moment by its own ``tillerman intent propose``
process. The daemon must record a decision about EVERY one of them promptly (its pickup:
proposal → first decision, from the ledger's times), not only when something else happens
on its thread, and every steer must land once, in its own turn.

The turns are held by a file, not by time: a long command does not hold one, since Codex's
``exec_command`` hands a command still running after 10 s back to the model, which ends
the turn, and on a loaded machine starting twelve threads takes longer than that. The
pickup bound is generous (a loaded 2-core machine meets it); a proposal the daemon folds
without judging waits for its thread's next event, which a held turn never gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer
from fixtures.scripted_model import RecordedRequest, ScriptedModel
from tests.live.daemon_support import SETTLED, ruleset_from, session, wait_until
from tests.live.test_daemon_live import NO_RULES, OWNER, OWNER_GRANT, our_echoes
from tillerman.ledger.events import DecisionRecorded, IntentProposed

pytestmark = [pytest.mark.live, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
PICKUP_BOUND = 3.0  # seconds from a proposal to the first decision recorded about it
#: A proposer imports the CLI, then waits for its thread and turn on stdin: all of them
#: get theirs at the same moment, so they commit together.
PROPOSER = ("import sys\nfrom tillerman.controller.cli.main import main\nthread, turn = sys.stdin.readline().split()\n"
            "main(['intent', 'propose', '--thread', thread, '--expected-turn', turn, *sys.argv[1:]])\n")


def start_proposers(ledger: Path, count: int) -> list[subprocess.Popen]:
    """One ``intent propose`` process per steer, started (and importing) ahead of time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen(
        [sys.executable, "-c", PROPOSER, "--mode", "steer", "--owner", OWNER, "--text",
         f"PICKUP {n}: note this and carry on.", "--ledger", str(ledger), "--json"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(count)]


def propose_together(proposers: list[subprocess.Popen], steers: list[tuple[str, str]]) -> list[dict]:
    for process, (thread, turn) in zip(proposers, steers, strict=True):
        process.stdin.write(f"{thread} {turn}\n")
    for process in proposers:
        process.stdin.flush()  # the go signal, to every process at once
    outputs = [p.communicate(timeout=60) for p in proposers]
    for process, (_, err) in zip(proposers, outputs, strict=True):
        assert process.returncode == 0, err
    return [json.loads(out) for out, _ in outputs]


def held(model: ScriptedModel, prompt: str) -> list[RecordedRequest]:
    """The model calls holding a turn open on ``prompt`` (each thread's first call)."""
    return [r for r in model.requests if r.last_user_text == prompt and r.tool_output_call_id is None]


async def check_every_pickup(app_server: AppServer, model: ScriptedModel, workspace: Path, tmp_path: Path,
                             threads: int) -> None:
    release = tmp_path / "release"
    hold = f"WAIT: {release}"
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        proposers = start_proposers(s.recorder.path, threads)
        try:
            steers = []
            for _ in range(threads):
                thread = await s.start_thread(workspace)
                steers.append((thread, await s.start_turn(thread, hold)))
            # Every turn waits on the model, and the daemon's fold has every turn active.
            await wait_until(lambda: len(held(model, hold)) == threads, "the model to hold every turn", timeout=60)
            await wait_until(lambda: all(s.projection().snapshot(t).active_turn_id == turn for t, turn in steers),
                             "the daemon to see every turn active", timeout=30)

            proposed = await anyio.to_thread.run_sync(propose_together, proposers, steers)
            ids = [p["id"] for p in proposed]
            # Codex 0.163 drops a held model request for a steer; older releases deliver the
            # steer when the request ends: either way every steer is in its turn first.
            await wait_until(lambda: all(s.intent(i).state in SETTLED | {"queued"} for i in ids),
                             "every steer to reach its turn (one never picked up waits for its held turn)",
                             timeout=60)
        finally:
            release.touch()  # ends whatever turn still waits
        await wait_until(lambda: all(s.intent(i).state in SETTLED for i in ids), "every steer to settle", timeout=60)

        entries = s.entries()
        proposed_at = {e.envelope.event.intent.id: e.envelope.at for e in entries
                       if isinstance(e.envelope.event, IntentProposed)}
        first_decision: dict[str, float] = {}
        for e in entries:
            event = e.envelope.event
            if isinstance(event, DecisionRecorded) and not event.shadow:
                first_decision.setdefault(event.intent_id, e.envelope.at)
        pickups = {i: first_decision[i] - proposed_at[i] for i in ids}
        print("pickups (s):", sorted(round(p, 3) for p in pickups.values()))
        slow = {i: round(p, 2) for i, p in pickups.items() if p > PICKUP_BOUND}
        assert not slow, f"picked up after more than {PICKUP_BOUND}s: {slow} (all: {pickups})"
        assert {i: s.intent(i).state for i in ids} == dict.fromkeys(ids, "acknowledged")
        # The harness reads the server on a connection of its own: a steer the daemon saw
        # echoed may not have reached the harness's log yet.
        await wait_until(lambda: all(our_echoes(s, s.intent(i).intent.client_user_message_id) for i in ids),
                         "the harness to see every steer's echo", timeout=10)
        for (thread, turn), intent_id in zip(steers, ids, strict=True):  # each landed once, in its own turn
            echoes = our_echoes(s, s.intent(intent_id).intent.client_user_message_id)
            assert [(e["threadId"], e["turnId"]) for e in echoes] == [(thread, turn)]


async def test_twelve_concurrent_proposals_are_each_picked_up_at_once(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    await check_every_pickup(app_server, scripted_model, workspace, tmp_path, threads=12)
