"""Traces of the app-server JSON-RPC that tillerman records (``--trace``).

One object per line: ``{"ts": <epoch seconds>, "dir": "in"|"out", "msg": {…}}``;
``in`` is from the server. Messages from the server go through the same mapping
as the live connection (``tillerman.monitor.appserver_events``); what the client sent
(steers, interrupts, approval answers) has no event of its own: its effects come
back from the server (the ``userMessage`` echo, ``turn/completed``,
``serverRequest/resolved``).
"""

from __future__ import annotations

from tillerman.ledger.events import Event
from tillerman.monitor.appserver_events import AppServerEvents
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.monitor.parser import Parser, WrongType, obj, text


class AppServerTraceParser(Parser):
    format = "appserver-trace"

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        self._mapping = AppServerEvents(patterns=self.patterns, retain_payloads=self.retain_payloads)
        self._asked: dict[tuple[type, object], str] = {}  # the client's request ids awaiting a reply → method

    def use_patterns(self, patterns: CommandPatterns) -> None:
        super().use_patterns(patterns)
        self._mapping.patterns = patterns

    def _time(self, record: dict) -> float | None:
        ts = record.get("ts")
        if ts is None or (isinstance(ts, (int, float)) and not isinstance(ts, bool)):
            return ts
        raise WrongType("ts")

    def _events(self, record: dict) -> list[Event]:
        direction = text(record, "dir")
        msg = obj(record, "msg")
        method = text(msg, "method")
        request_id = msg.get("id")
        key = (type(request_id), request_id)
        if direction == "out":
            if method is not None and isinstance(request_id, (int, str)):
                self._asked[key] = method
            return []
        if direction != "in":
            self.unknown_types[f"dir:{direction}"] += 1
            return []
        if method is None and isinstance(request_id, (int, str)):
            asked = self._asked.pop(key, None)
            result = msg.get("result")
            return self._mapping.response(asked, result) if asked and isinstance(result, dict) else []
        if method is not None and not self._mapping.knows(method):
            self.unknown_types[method] += 1
            return []
        return self._mapping.normalize(msg)
