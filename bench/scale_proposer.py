"""The proposer of ``bench_scale``: another process proposing steers while the daemon works.

    python -m bench.scale_proposer LEDGER SOCKET SECONDS SEED

It connects, then waits for a line on stdin (the benchmark's "go", so that its start
costs no time in the measured window); for ``SECONDS`` it then proposes a steer every 0.1–0.3 s (random, seeded) on a random
thread of the fake app-server, alternately aimed at the thread's turn running now
(``active``) and at its next turn (``next``: decided when that turn's
``turn/started`` arrives). It learns the turns as a harness would, over its own
connection (``thread/turns/list``), and proposes through the library, a durable
append, as ``tillerman intent propose`` does. One JSON line per intent, printed
once its commit has returned: id, that moment, kind, the turn aimed at, and the
client message id its steer will carry.
"""

from __future__ import annotations

import json
import random
import sys
import time

import anyio

from fixtures.fake_appserver import next_turn_id
from tillerman.controller.core import intent_requests
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_client import open_app_server
from tillerman.rules.owner import local_login

TEXT = "Stop re-running the whole suite; run the failing test alone and read its output."


async def propose(ledger: str, socket: str, seconds: float, seed: int) -> None:
    rnd = random.Random(seed)
    async with open_app_server(f"unix://{socket}", client_name="bench-proposer") as client, \
            anyio.create_task_group() as tg:
        tg.start_soon(_drain, client)  # the broadcast status changes: read, not kept
        threads = (await client.request("thread/loaded/list", {}))["data"]
        await anyio.to_thread.run_sync(sys.stdin.readline)
        with SQLiteRecorder(ledger) as recorder:
            end = time.monotonic() + seconds
            count = 0
            while time.monotonic() < end:
                await anyio.sleep(rnd.uniform(0.1, 0.3))
                thread = rnd.choice(threads)
                latest = (await client.request("thread/turns/list", {"threadId": thread, "limit": 1}))["data"][0]
                kind = "next" if count % 2 or latest["status"] != "inProgress" else "active"
                turn = next_turn_id(latest["id"]) if kind == "next" else latest["id"]
                intent = intent_requests.propose(recorder, thread_id=thread, expected_turn=turn, mode="steer", text=TEXT,
                                         owner=local_login())
                print(json.dumps({"intent": intent.id, "at": time.time(), "kind": kind, "turn": turn,
                                  "client_id": intent.client_user_message_id}), flush=True)
                count += 1
        tg.cancel_scope.cancel()


async def _drain(client) -> None:
    async for _ in client.incoming:
        pass


if __name__ == "__main__":
    ledger_path, socket_path, window, seed_text = sys.argv[1:5]
    anyio.run(propose, ledger_path, socket_path, float(window), int(seed_text), backend="asyncio")
