"""``TextFrames``: the client reads the server's plain text frames itself, in order with
everything websockets still reads (control frames, a fragmented message and what
follows it), and holds the socket back when its consumer is behind."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.server import unix_serve
from websockets.frames import Frame, Opcode

from tillerman.monitor.appserver_client import AppServerClient, TextFrames, open_websocket


def _note(n: int) -> str:
    return json.dumps({"method": "turn/started", "params": {"threadId": "t", "turn": {"id": f"u{n}"}}})


async def _serving(tmp_path: Path, script):
    """A WebSocket server on a Unix socket whose connection runs ``script`` once the
    client said something (as the app-server sends nothing before ``initialize``)."""
    async def started(ws):
        await ws.recv()
        await script(ws)

    return await unix_serve(started, str(tmp_path / "s.sock"))


async def _client(tmp_path: Path, limit: int | None = None) -> AppServerClient:
    websocket = await open_websocket(f"unix://{tmp_path / 's.sock'}")
    assert isinstance(websocket, TextFrames)
    client = AppServerClient(websocket, None)
    if limit is not None:
        client.incoming.limit = limit
    await client.notify("initialized")
    return client


async def _ids(client: AppServerClient, count: int) -> list[str]:
    with anyio.fail_after(10):
        return [(await client.incoming.receive()).params["turn"]["id"] for _ in range(count)]


@pytest.mark.anyio
async def test_plain_text_frames_never_reach_websockets_parser(tmp_path, monkeypatch):
    parsed = []
    original = Frame.parse.__func__

    def counting(cls, *args, mask, **kwargs):
        frame = yield from original(cls, *args, mask=mask, **kwargs)
        if not mask:  # the client's side (the server's reads are masked)
            parsed.append(frame.opcode)
        return frame

    async def script(ws):
        for n in range(50):
            await ws.send(_note(n))
        await ws.wait_closed()

    async with await _serving(tmp_path, script):
        monkeypatch.setattr(Frame, "parse", classmethod(counting))
        client = await _client(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client._read_frames)
            assert await _ids(client, 50) == [f"u{n}" for n in range(50)]
            tg.cancel_scope.cancel()
        await client._websocket.close()
    assert Opcode.TEXT not in parsed


@pytest.mark.anyio
async def test_pings_are_answered_and_a_fragmented_message_keeps_the_order(tmp_path):
    async def script(ws):
        await ws.send(_note(0))
        await (await ws.ping())  # answered by websockets, between two text frames
        await ws.send(_note(1))
        await ws.send([_note(2)[:10], _note(2)[10:]])  # fragmented: websockets reads from here on
        for n in range(3, 6):
            await ws.send(_note(n))
        await ws.wait_closed()

    async with await _serving(tmp_path, script):
        client = await _client(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client._read_frames)
            assert await _ids(client, 6) == [f"u{n}" for n in range(6)]
            tg.cancel_scope.cancel()
        await client._websocket.close()


@pytest.mark.anyio
async def test_a_consumer_that_falls_behind_holds_the_socket_back_and_loses_nothing(tmp_path):
    sent = []

    async def script(ws):
        for n in range(400):
            await ws.send(_note(n) + " " * 2000)  # big enough to fill the socket's buffers
            sent.append(n)
        await ws.wait_closed()

    async with await _serving(tmp_path, script):
        client = await _client(tmp_path, limit=16)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client._read_frames)
            await anyio.sleep(0.3)  # nobody reads
            assert len(client.incoming) < 16 + 100 and len(sent) < 400  # held back, not read to the end
            assert await _ids(client, 400) == [f"u{n}" for n in range(400)]
            tg.cancel_scope.cancel()
        await client._websocket.close()


@pytest.mark.anyio
async def test_frames_that_arrive_after_the_reader_ended_are_not_taken(tmp_path):
    """The server may go on sending after the client stopped reading (the daemon ending a
    connection): those frames are not handed to the closed message stream, and nothing
    is raised in the event loop's callback."""
    failures = []
    anyio_loop = __import__("asyncio").get_running_loop()
    anyio_loop.set_exception_handler(lambda loop, context: failures.append(context))
    go_on = anyio.Event()

    async def script(ws):
        await ws.send(_note(0))
        await go_on.wait()
        for n in range(1, 20):
            await ws.send(_note(n))
        await ws.wait_closed()

    async with await _serving(tmp_path, script):
        client = await _client(tmp_path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client._read_frames)
            assert await _ids(client, 1) == ["u0"]
            tg.cancel_scope.cancel()
        go_on.set()
        await anyio.sleep(0.2)  # the frames arrive at a client whose reader is gone
        await client._websocket.close()
    assert failures == []
