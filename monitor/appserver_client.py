"""The I/O driver for one WebSocket connection to a Codex app-server.

Connects over the app-server's Unix socket (``unix://PATH``: WebSocket frames over the
socket, not JSON lines) or ``ws://HOST:PORT``, initializes the session, and then
offers `request()` plus a stream of everything the server sends on its own
(notifications, server requests such as approvals, and frames that did not parse).

The supervisor observes approval requests but never answers them: every subscriber
receives each request and the first answer wins, so an unplanned answer would race the
human. This client therefore has no way to answer one.

Runs on anyio's asyncio backend (websockets' client is asyncio-only).
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tillerman.ledger.errors import UnsafeOutput
from tillerman.ledger.paths import open_for_append
from websockets.protocol import State

from tillerman.monitor.lines import valid_utf8
from tillerman.monitor.jsonrpc import (
    BadMessage,
    ErrorResponse,
    Notification,
    Response,
    RpcSession,
    ServerRequest,
)

DEFAULT_CLIENT_NAME = "tillerman"
# The server announces 16 MiB unfragmented; a fully hydrated thread/resume can be large.
MAX_FRAME_BYTES = 64 * 1024 * 1024

Direction = Literal["in", "out"]
# Called with each message as a decoded JSON object, or a BadMessage for a frame that
# did not parse (see JsonlTrace for how those are written).
TraceSink = Callable[[Direction, Any], None]
ServerMessage = Notification | ServerRequest | BadMessage
# Takes a frame the caller can read without its dict (``decode_hot``), or returns None.
FastDecode = Callable[[str | bytes], Any]


class AppServerDisconnected(ConnectionError):
    """The connection closed while a request was waiting for its answer."""


class HandshakeRefused(ConnectionError):
    """Something listens at the address but refused the WebSocket upgrade."""


class TraceFileError(Exception):
    """The trace file cannot be opened safely; the message is one line for the user."""


class JsonlTrace:
    """A trace sink writing `{"ts", "dir", "msg"}` JSON lines to an owner-only file.

    ``redact`` is applied to each message before it is written (the caller's privacy
    policy). A frame that was not JSON is written as ``{"ts", "dir", "raw": <text>}``,
    its text redacted the same way (to its digest and size).

    The file is appended to (a daemon's restarts share one trace). It is created
    owner-only, and an existing one is made owner-only too: what it held before was
    written under the same privacy policy, and what comes next may not be. Where it may
    be written is the safe output rule's to say (``tillerman.ledger.paths``): never a
    FIFO (it would block the daemon), a device, a ledger or a file of one; a symlink to
    a file that may be written is written through.
    """

    def __init__(self, path: Path | str, redact: Callable[[Any], Any] | None = None):
        try:
            fd = open_for_append(path, "the trace file", mode=0o600)
        except UnsafeOutput as exc:
            raise TraceFileError(str(exc)) from None
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
                os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            raise
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._redact = redact

    def __call__(self, direction: Direction, message: Any) -> None:
        record: dict[str, Any] = {"ts": time.time(), "dir": direction}
        if isinstance(message, BadMessage) and message.decoded is None:
            record["raw"] = self._redact(message.frame) if self._redact else message.frame
        else:
            decoded = message.decoded if isinstance(message, BadMessage) else message
            record["msg"] = self._redact(decoded) if self._redact else decoded
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def backoff_delays(initial: float = 0.1, factor: float = 2.0, maximum: float = 5.0) -> Iterator[float]:
    """Endless exponential delays for reconnect loops: 0.1, 0.2, 0.4, … capped at `maximum`."""
    delay = initial
    while True:
        yield delay
        delay = min(delay * factor, maximum)


class TextFrames(ClientConnection):
    """A client connection that reads the server's plain text frames itself.

    websockets parses each frame in Python through a generator, a frame object, a
    message queue and a task wake-up: about 25 µs a frame, a quarter of the daemon's
    time at 200 busy threads (10,000 notifications a second). Once a reader is set
    (``read_text_with``), each complete frame that is final, text, unmasked, without
    reserved bits, within ``max_size`` and valid UTF-8 — every frame Codex sends — is
    handed to it as bytes from ``data_received``, in order, with no task switch.
    Anything else goes to websockets as before: a control frame (ping, pong, close)
    alone, at a frame boundary, so websockets answers it and its parser stays at the
    next boundary; the first data frame of another kind (binary, fragmented, masked,
    too large, not UTF-8) with everything after it, for good, so that the order of
    messages holds and websockets refuses what it refused before."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_text: Callable[[bytes], None] | None = None
        self._rest = b""  # the start of a frame not complete yet

    def read_text_with(self, on_text: Callable[[bytes], None]) -> bool:
        """Hand plain text frames to ``on_text`` from now on; False (and nothing changes)
        when websockets already holds bytes it has not parsed: they are its to read."""
        if self.protocol.reader.buffer or self.protocol.state is not State.OPEN:
            return False
        self._on_text = on_text
        return True

    def stop_reading_text(self) -> None:
        """Leave every frame to websockets again (the reader that took them ended): what
        arrives from now on waits in websockets' buffer, unread, as it did before."""
        if self._on_text is None:
            return
        self._on_text, rest, self._rest = None, self._rest, b""
        if rest:
            super().data_received(rest)

    def hold_reading(self, held: bool) -> None:
        """Stop (or go on) taking bytes off the socket: the reader's consumer is behind."""
        if self.transport.is_closing():
            return
        if held:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        on_text = self._on_text
        if on_text is None:
            super().data_received(data)
            return
        buffer = self._rest + data if self._rest else data
        size, at, limit = len(buffer), 0, self.protocol.max_message_size
        while size - at >= 2:
            first, second = buffer[at], buffer[at + 1]
            length, start = second & 0x7F, at + 2
            if length == 126:
                length, start = int.from_bytes(buffer[at + 2:at + 4]), at + 4
            elif length == 127:
                length, start = int.from_bytes(buffer[at + 2:at + 10]), at + 10
            if start > size:
                break  # the length is not all here yet
            end = start + length
            if first == 0x81 and second < 0x80 and (limit is None or length <= limit):
                if end > size:
                    break
                payload = buffer[start:end]
                if payload.isascii() or valid_utf8(payload):
                    at = end
                    on_text(payload)
                    continue
            if first & 0x0F >= 8 and first & 0x70 == 0 and second < 0x80 and length <= 125:  # control
                if end > size:
                    break
                super().data_received(buffer[at:end])
                at = end
                continue
            self._on_text, self._rest = None, b""  # websockets reads on from this frame
            super().data_received(buffer[at:])
            return
        self._rest = buffer[at:]


async def open_websocket(url: str) -> ClientConnection:
    """One WebSocket connection to an app-server (no initialize); the shim uses it as is."""
    # No Origin header is sent: the app-server answers 403 to any request carrying one.
    # No permessage-deflate offer either: Codex 0.155.1 and older close the connection
    # without an answer when a client offers it, and the frames go over a local
    # socket, where compressing costs more than it saves.
    if url.startswith("unix://"):
        path = url.removeprefix("unix://")
        return await unix_connect(path, uri="ws://localhost/", max_size=MAX_FRAME_BYTES, compression=None,
                                  create_connection=TextFrames)
    if url.startswith(("ws://", "wss://")):
        return await connect(url, max_size=MAX_FRAME_BYTES, compression=None, create_connection=TextFrames)
    raise ValueError(f"unsupported app-server URL {url!r}: expected unix://PATH or ws://HOST:PORT")


async def open_websocket_with_retry(url: str, timeout: float) -> ClientConnection:
    """Connects, retrying with backoff while the server is not (yet) listening.

    On timeout, raises `TimeoutError` chained to the last failure, so the reason a
    server refused (its HTTP answer, a closed socket) is not lost."""
    delays = backoff_delays()
    last: Exception | None = None
    with anyio.move_on_after(timeout):
        while True:
            try:
                return await open_websocket(url)
            except (OSError, InvalidHandshake) as exc:
                last = exc
                await anyio.sleep(next(delays))
    raise TimeoutError(f"no connection to {url} within {timeout:g}s") from last


# Messages the reader holds for a consumer that has not taken them yet: about a second of
# 200 busy threads (50 notifications a second each), a few tens of MiB.
INCOMING_LIMIT = 8192


class ServerMessages:
    """What the server sent on its own (notifications, server requests, frames that did
    not parse), in order, for one consumer: ``async for``, ``receive``, ``receive_nowait``.

    Bounded: while it holds ``limit`` messages the reader takes no frame off the socket,
    so a consumer that falls behind holds back the server's writes (the socket's buffers
    fill) instead of growing this process. Codex's app-server does not wait long for a
    slow connection: once its own queue for the connection (128 messages) is full it
    closes it. What was read by then is still delivered, and a reconnecting consumer
    (the daemon) resumes its threads and reads back what it missed.

    The bound yields to any request waiting for its answer: the answer may be behind
    the messages held, and the consumer may be the one waiting (the daemon subscribes
    before it reads), so the reader goes on reading until no request waits."""

    def __init__(self, limit: int = INCOMING_LIMIT) -> None:
        self.limit = limit
        self._send, self._receive = anyio.create_memory_object_stream[ServerMessage](math.inf)
        self._held = 0
        self._room = anyio.Event()
        self._resume: Callable[[], None] | None = None  # see ``hold``

    def __len__(self) -> int:
        return self._held

    def __aiter__(self) -> ServerMessages:
        return self

    async def __anext__(self) -> ServerMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def receive(self) -> ServerMessage:
        return self._taken(await self._receive.receive())

    def receive_nowait(self) -> ServerMessage:
        """The next message held; raises ``anyio.WouldBlock`` when none is (yet), and
        ``anyio.EndOfStream`` once the connection is gone and every message taken."""
        return self._taken(self._receive.receive_nowait())

    def _taken(self, message: ServerMessage) -> ServerMessage:
        self._held -= 1
        if self._held < self.limit:
            self._room_made()
        return message

    def put(self, message: ServerMessage) -> None:
        self._held += 1
        self._send.send_nowait(message)

    def close(self) -> None:
        self._send.close()

    async def wait_for_room(self) -> None:
        """Until a message is taken (or ``wake``)."""
        self._room = anyio.Event()
        await self._room.wait()

    def wake(self) -> None:
        self._room_made()

    def hold(self, resume: Callable[[], None]) -> None:
        """The reader stopped taking bytes off the socket from a callback, where it
        cannot wait: ``resume`` is called once a message is taken (or ``wake``)."""
        self._resume = resume

    def _room_made(self) -> None:
        self._room.set()
        if self._resume is not None:
            resume, self._resume = self._resume, None
            resume()


class AppServerClient:
    """One initialized app-server connection. Create it with `open_app_server`."""

    def __init__(self, websocket: ClientConnection, trace: TraceSink | None, fast: FastDecode | None = None):
        self._websocket = websocket
        self._trace = trace
        # A trace records every message whole: with one, every frame is decoded as a dict.
        self._fast = fast if trace is None else None
        self._session = RpcSession()
        self._answers: dict[str, Response | ErrorResponse | None] = {}
        self._answered: dict[str, anyio.Event] = {}
        self.incoming = ServerMessages()
        self.initialize_result: dict[str, Any] = {}
        if isinstance(websocket, TextFrames):
            websocket.read_text_with(self._take_text)

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        """Sends a request and returns its result; raises `RpcError`, `TimeoutError` or
        `AppServerDisconnected`."""
        request_id, message = self._session.request(method, params)
        answered = self._answered[request_id] = anyio.Event()
        self.incoming.wake()  # a reader held back by a full ``incoming`` reads on to the answer
        try:
            try:
                await self._send(message)
            except ConnectionClosed:
                raise AppServerDisconnected(f"connection closed before {method} was sent") from None
            with anyio.fail_after(timeout):
                await answered.wait()
        finally:
            self._answered.pop(request_id, None)
            answer = self._answers.pop(request_id, None)
            self._session.forget(request_id)
        if answer is None:
            raise AppServerDisconnected(f"connection closed before {method} was answered")
        if isinstance(answer, ErrorResponse):
            raise answer.error
        return answer.result

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self._send(RpcSession.notification(method, params))

    async def _send(self, message: dict[str, Any]) -> None:
        if self._trace:
            self._trace("out", message)
        await self._websocket.send(RpcSession.encode(message))

    async def _initialize(self, client_name: str, timeout: float) -> None:
        self.initialize_result = await self.request(
            "initialize",
            {
                "clientInfo": {"name": client_name, "title": None, "version": "0.1.0"},
                # thread/queue/* are experimental methods.
                "capabilities": {"experimentalApi": True},
            },
            timeout=timeout,
        )
        await self.notify("initialized")

    async def _read_frames(self) -> None:
        try:
            async for frame in self._websocket:  # what ``TextFrames`` leaves to websockets
                self._take(frame)
                while len(self.incoming) >= self.incoming.limit and not self._answered:
                    await self.incoming.wait_for_room()
        except ConnectionClosed:
            pass
        finally:
            if isinstance(self._websocket, TextFrames):
                self._websocket.stop_reading_text()
            self.incoming.close()
            for answered in self._answered.values():
                answered.set()  # with no answer stored: the request raises AppServerDisconnected

    def _take(self, frame: str | bytes) -> None:
        taken = self._fast(frame) if self._fast is not None else None
        if taken is not None:
            self.incoming.put(taken)
        else:
            self._dispatch(self._session.receive(frame))

    def _take_text(self, frame: bytes) -> None:
        """A frame ``TextFrames`` read itself, taken as ``_read_frames`` takes one; the
        same bound, held by pausing the socket (a callback cannot wait)."""
        self._take(frame)
        if len(self.incoming) >= self.incoming.limit and not self._answered:
            self._websocket.hold_reading(True)
            self.incoming.hold(lambda: self._websocket.hold_reading(False))

    def _dispatch(self, message: Any) -> None:
        if self._trace:
            self._trace("in", message if isinstance(message, BadMessage) else message.raw)
        if isinstance(message, (Response, ErrorResponse)):
            self._answers[message.id] = message
            self._answered[message.id].set()
        else:
            self.incoming.put(message)


@asynccontextmanager
async def open_app_server(
    url: str,
    *,
    client_name: str = DEFAULT_CLIENT_NAME,
    trace: TraceSink | None = None,
    connect_timeout: float = 10.0,
    retry: bool = True,
    client_class: type[AppServerClient] = AppServerClient,
    fast: FastDecode | None = None,
) -> AsyncIterator[AppServerClient]:
    """Connects (retrying until `connect_timeout`, unless `retry` is off: a caller with
    its own reconnect loop wants each failure as it happens), initializes, and yields
    the client.

    The first client to initialize names the originator of every thread the server
    creates afterwards, so a supervisor that connects before the harness should pass the
    harness's `client_name`.

    ``fast`` decodes the notifications it knows into what the caller reads instead
    (``tillerman.monitor.appserver_events.decode_hot``); every other frame, and every
    frame while a trace is written, goes through ``RpcSession``.
    """
    if retry:
        websocket = await open_websocket_with_retry(url, connect_timeout)
    else:
        with anyio.fail_after(connect_timeout):
            try:
                websocket = await open_websocket(url)
            except InvalidHandshake as exc:  # the server answered, but not with a WebSocket
                raise HandshakeRefused("WebSocket handshake refused") from exc
    async with websocket, anyio.create_task_group() as tasks:
        client = client_class(websocket, trace, fast)
        tasks.start_soon(client._read_frames)
        try:
            await client._initialize(client_name, connect_timeout)
            yield client
        finally:
            tasks.cancel_scope.cancel()
