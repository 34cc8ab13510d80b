"""How ``tillerman run`` writes its log: plain lines, or ``--log-format json`` for a
log collector (journald, Loki, Vector): one JSON object per line, never a line split."""

from __future__ import annotations

import json
import logging

from tillerman.controller.timefmt import iso

TEXT_FORMAT = "%(asctime)s tillerman %(levelname)s %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": iso(record.created), "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(*, verbose: bool, log_format: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    # watchfiles' "N changes detected" says nothing of what tillerman did with them.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
