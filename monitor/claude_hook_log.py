"""Claude Code hook payloads as hook-logging scripts keep them: one JSON object a line,
the payload wrapped with the hook's name and the time the script ran.

The layouts found in the wild: the payload's fields beside ``event`` (the hook name)
and ``ts``; the payload whole under ``payload``, beside ``event`` and ``ts`` or
``timestamp``; the payload as it came (``hook_event_name`` and all) with a ``ts``
added. The hook name is Claude Code's (``PreToolUse``) or the scripts' file-name
spelling of it (``pre_tool_use``). The time is ISO-8601 or epoch seconds; it is the
record's source time, so a log replays on its own clock.

Everything else is the hook payload format's (``tillerman.monitor.claude_hooks``),
under a format of its own: such a log is a record of what happened, never the spool
of tillerman's own hook, so its sessions take no delivery through hooks.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tillerman.ledger.events import Event
from tillerman.monitor.claude_hooks import ClaudeHooksParser
from tillerman.monitor.parser import WrongType, iso_time

#: The fields a logging script adds around a payload.
ENVELOPE = frozenset({"event", "ts", "timestamp", "payload"})


class ClaudeHookLogParser(ClaudeHooksParser):
    format = "claude-hook-log"
    untimed: ClassVar[bool] = False

    def _time(self, record: dict) -> float | None:
        stamp = record.get("ts", record.get("timestamp"))
        if isinstance(stamp, int | float) and not isinstance(stamp, bool):
            return stamp  # epoch seconds, range-checked before conversion (``source_time``)
        if stamp is None or isinstance(stamp, str):
            return iso_time(stamp)
        raise WrongType("ts")

    def _events(self, record: dict) -> list[Event]:
        return super()._events(hook_payload(record))


def hook_payload(record: dict) -> dict[str, Any]:
    """The hook payload a log line wraps, with its ``hook_event_name``."""
    inner = record.get("payload")
    payload = dict(inner) if isinstance(inner, dict) else {k: v for k, v in record.items() if k not in ENVELOPE}
    name = record.get("event")
    if "hook_event_name" not in payload and isinstance(name, str):
        payload["hook_event_name"] = hook_name(name)
    return payload


def hook_name(name: str) -> str:
    """Claude Code's name of a hook from a script's spelling: ``pre_tool_use`` is
    ``PreToolUse``; a name already spelt so stays as it is."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))
