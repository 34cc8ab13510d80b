"""``tillerman shim``: stdio JSON lines <-> WebSocket frames on the shared app-server.

A harness that can only spawn ``codex app-server`` on stdio spawns this instead; the
shared server (and tillerman beside it) then see the harness as one more client.
Lines are forwarded as they are, in order; nothing is rewritten.
"""

from __future__ import annotations

import sys

import anyio
from websockets.exceptions import ConnectionClosed

from tillerman.monitor.appserver_client import open_websocket


async def run_shim(socket_path: str) -> None:
    async with await open_websocket(f"unix://{socket_path}") as ws:
        async with anyio.create_task_group() as tg:

            async def upstream() -> None:
                stdin = anyio.wrap_file(sys.stdin.buffer)
                async for line in stdin:
                    if line.strip():
                        await ws.send(line.decode("utf-8").rstrip("\n"))
                tg.cancel_scope.cancel()  # the harness closed stdin: it is done

            async def downstream() -> None:
                stdout = sys.stdout.buffer
                try:
                    async for frame in ws:
                        stdout.write((frame if isinstance(frame, bytes) else frame.encode()) + b"\n")
                        stdout.flush()
                except ConnectionClosed:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(upstream)
            tg.start_soon(downstream)
