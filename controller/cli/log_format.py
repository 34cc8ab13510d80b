"""How ``tillerman run`` writes its log: plain lines (outside text in them with its
control characters shown as codes), or ``--log-format json`` for a log collector
(journald, Loki, Vector): one JSON object per line, never a line split."""

from __future__ import annotations

import json
import logging

from tillerman.controller.core.printable import printable
from tillerman.controller.core.timefmt import iso

TEXT_FORMAT = "%(asctime)s tillerman %(levelname)s %(message)s"
LOG_FORMATS = ("text", "json")


class TextFormatter(logging.Formatter):
    """Plain lines whose messages may quote outside text (a thread id, a file name, a
    server's error): each line's control characters are shown as codes, so a message
    stays one line and nothing in it acts on the terminal; a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei) -> str:
        return _printable_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _printable_lines(super().formatStack(stack_info))


def _printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.splitlines())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": iso(record.created), "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def log_handler(log_format: str, stream=None) -> logging.Handler:
    """Where ``run``'s log goes (stderr unless ``stream``), in the format asked for."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    return handler


def configure_logging(*, verbose: bool, log_format: str) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[log_handler(log_format)])
    # watchfiles' "N changes detected" says nothing of what tillerman did with them.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    # The ledger pool's warning at each attempt to reconnect repeats what the daemon says
    # once per outage (``tillerman.controller.daemon.ledger_health``).
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
