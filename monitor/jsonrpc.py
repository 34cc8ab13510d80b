"""Sans-IO JSON-RPC for the Codex app-server protocol.

The app-server speaks JSON-RPC 2.0 without the ``"jsonrpc"`` field:

* requests ``{"id", "method", "params"}``; ids may be strings or integers and keep their
  type. Ours are strings ``tl-<n>``: a harness sharing the server with us counts with
  integers, and a distinct prefix keeps our ids recognisable in traces;
* responses ``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}``;
* notifications ``{"method", "params"}`` (the server adds ``emittedAtMs``);
* server-to-client requests (approvals) ``{"id", "method", "params"}`` with integer ids
  that count up across the whole server process.

`RpcSession` allocates ids, encodes outgoing messages, and turns each incoming frame
into exactly one typed value. It never raises on input: a frame that is not JSON (or
nests deeper than ``tillerman.monitor.lines.MAX_DEPTH``), not an object, has an id of the wrong
type or an unknown shape becomes a `BadMessage`, so the caller can quarantine it and
carry on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from tillerman.monitor.lines import TOO_DEEP, TooDeep, decode_json

RequestId = str | int

_encoder = msgspec.json.Encoder()


class RpcError(Exception):
    """An error response from the server (the app-server uses -32600 for most refusals)."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


@dataclass(frozen=True)
class Response:
    id: str
    method: str  # of the request it answers
    result: Any
    raw: dict[str, Any]


@dataclass(frozen=True)
class ErrorResponse:
    id: str
    method: str
    error: RpcError
    raw: dict[str, Any]


@dataclass(frozen=True)
class Notification:
    method: str
    params: dict[str, Any]
    raw: dict[str, Any]


@dataclass(frozen=True)
class ServerRequest:
    id: int
    method: str
    params: dict[str, Any]
    raw: dict[str, Any]


@dataclass(frozen=True)
class BadMessage:
    """A frame that is not a valid app-server message; `decoded` is None if it was not JSON."""

    frame: str
    reason: str
    decoded: Any = None


Incoming = Response | ErrorResponse | Notification | ServerRequest | BadMessage


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _params(message: dict[str, Any]) -> dict[str, Any] | None:
    params = message.get("params", {})
    return params if isinstance(params, dict) else None


@dataclass
class RpcSession:
    """The protocol state of one connection: the id counter and the requests awaiting answers."""

    id_prefix: str = "tl-"
    _next: int = 0
    _pending: dict[str, str] = field(default_factory=dict)  # id -> method

    @property
    def pending(self) -> dict[str, str]:
        return dict(self._pending)

    def request(self, method: str, params: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new request: its id and the message to send."""
        self._next += 1
        request_id = f"{self.id_prefix}{self._next}"
        self._pending[request_id] = method
        return request_id, {"id": request_id, "method": method, "params": params or {}}

    def forget(self, request_id: str) -> None:
        """Stop waiting for a request (it timed out); a late answer becomes a BadMessage."""
        self._pending.pop(request_id, None)

    @staticmethod
    def notification(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = params
        return message

    @staticmethod
    def response(request_id: RequestId, result: Any) -> dict[str, Any]:
        """The answer to a server request (for a harness; the supervisor never answers)."""
        return {"id": request_id, "result": result}

    @staticmethod
    def encode(message: dict[str, Any]) -> str:
        return _encoder.encode(message).decode()

    def receive(self, frame: str | bytes) -> Incoming:
        text = frame.decode(errors="replace") if isinstance(frame, bytes) else frame
        try:
            message = decode_json(frame)
        except TooDeep as exc:
            return BadMessage(text, f"{TOO_DEEP}: {exc}")
        except msgspec.DecodeError as exc:
            return BadMessage(text, f"invalid JSON: {exc}")
        if not isinstance(message, dict):
            return BadMessage(text, "not a JSON object", message)
        method = message.get("method")
        if "id" in message and method is None and ("result" in message or "error" in message):
            return self._receive_response(text, message)
        if isinstance(method, str):
            params = _params(message)
            if params is None:
                return BadMessage(text, "params is not an object", message)
            if "id" not in message:
                return Notification(method, params, message)
            if _is_int(message["id"]):
                return ServerRequest(message["id"], method, params, message)
            return BadMessage(text, "server request id is not an integer", message)
        return BadMessage(text, "unknown message shape", message)

    def _receive_response(self, text: str, message: dict[str, Any]) -> Incoming:
        request_id = message["id"]
        if not (isinstance(request_id, str) or _is_int(request_id)):
            return BadMessage(text, "id is neither a string nor an integer", message)
        if request_id not in self._pending:
            return BadMessage(text, f"response to an unknown request id {request_id!r}", message)
        if "error" in message:
            error = message["error"]
            if not (
                isinstance(error, dict)
                and _is_int(error.get("code"))
                and isinstance(error.get("message"), str)
            ):
                return BadMessage(text, "malformed error object", message)
            method = self._pending.pop(request_id)
            rpc_error = RpcError(error["code"], error["message"], error.get("data"))
            return ErrorResponse(request_id, method, rpc_error, message)
        method = self._pending.pop(request_id)
        return Response(request_id, method, message["result"], message)
