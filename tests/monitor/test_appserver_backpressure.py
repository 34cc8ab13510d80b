"""A consumer that falls behind holds the reader back (``ServerMessages``): the client
holds at most its limit of unread messages, loses none, and a request waiting for its
answer is never stuck behind the ones it holds."""

from __future__ import annotations

import json

import anyio
import pytest

from tillerman.monitor.appserver_client import AppServerClient

LIMIT = 16


def _note(n: int) -> str:
    return json.dumps({"method": "turn/started", "params": {"threadId": "t", "turn": {"id": f"u{n}"}}})


class Socket:
    """Stands in for the WebSocket: ``count`` notifications as fast as the reader takes
    them, each request answered after whatever was sent before it."""

    def __init__(self, count: int) -> None:
        self.frames = [_note(n) for n in range(count)]
        self.taken = 0  # frames the reader took off the socket
        self.done = anyio.Event()

    def __aiter__(self):
        return self._frames()

    async def _frames(self):
        while self.taken < len(self.frames):
            self.taken += 1
            yield self.frames[self.taken - 1]
            await anyio.sleep(0)
        await self.done.wait()

    async def send(self, text: str) -> None:
        request = json.loads(text)
        self.frames.append(json.dumps({"id": request["id"], "result": {"ok": True}}))


def _client(count: int) -> tuple[AppServerClient, Socket]:
    socket = Socket(count)
    client = AppServerClient(socket, None)
    client.incoming.limit = LIMIT
    return client, socket


@pytest.mark.anyio
async def test_a_consumer_that_falls_behind_holds_the_reader_back_and_loses_nothing():
    client, socket = _client(10 * LIMIT)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client._read_frames)
        await anyio.sleep(0.2)  # nobody reads
        assert socket.taken == LIMIT and len(client.incoming) == LIMIT
        received = []
        while len(received) < 10 * LIMIT:
            received.append(await client.incoming.receive())
            assert len(client.incoming) <= LIMIT
        socket.done.set()
    assert [m.params["turn"]["id"] for m in received] == [f"u{n}" for n in range(10 * LIMIT)]


@pytest.mark.anyio
async def test_a_request_is_answered_while_the_consumer_is_behind():
    """The daemon's connection task subscribes (a request) before it reads: the answer
    comes after more messages than the limit, and must still arrive."""
    client, socket = _client(10 * LIMIT)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client._read_frames)
        await anyio.sleep(0.1)
        assert len(client.incoming) == LIMIT  # held back when the request is sent
        with anyio.fail_after(5):
            assert await client.request("thread/loaded/list") == {"ok": True}
        assert len(client.incoming) == 10 * LIMIT  # read past the limit to reach the answer
        received = [client.incoming.receive_nowait() for _ in range(10 * LIMIT)]
        socket.done.set()
    assert [m.params["turn"]["id"] for m in received] == [f"u{n}" for n in range(10 * LIMIT)]
