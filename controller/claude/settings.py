"""tillerman's hook entries in Claude Code's ``settings.json``: merged in beside the
user's own, and taken out again, exactly. Pure: a settings object in, a new one out.

Claude Code's shape: ``{"hooks": {"<Event>": [{"matcher": "...", "hooks": [{"type":
"command", "command": "...", "timeout": s}]}]}}``. Ours are told apart by their
command, which runs ``tillerman hook claude`` (or its bare module); every other key, event, group and
hook is left as it was, in its order.

The file is the user's: it is read (``read_settings``) only when what is written back
(``settings_text``) says exactly what it said — a duplicate key (one of the two would be
dropped), a number JSON cannot hold (``1e400`` would come back as ``Infinity``, which is
not JSON) or nesting deeper than ``MAX_DEPTH`` is refused, and the file left as it was.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "PostToolUse",
               "PostToolUseFailure", "Stop", "StopFailure", "SubagentStop", "Notification", "PreCompact",
               "SessionEnd")
HOOK_MODULE = "tillerman.controller.claude_hook"  # what an installed hook runs: a stable path (see that module)
OUR_COMMANDS = (HOOK_MODULE, "tillerman hook claude")
TIMEOUT_SECONDS = 10  # a hook that only appends a line; Claude Code's own default is 60


#: The deepest nesting of objects and lists read. Claude Code's own settings nest five
#: deep; a deeper file is refused rather than followed to the interpreter's limit.
MAX_DEPTH = 64


class SettingsShapeError(ValueError):
    """The settings hold something other than Claude Code's hook shape where ours go."""


class SettingsNotExact(ValueError):
    """The settings could not be written back saying exactly what they said."""


def read_settings(text: str) -> dict[str, Any]:
    """The settings object in ``text`` (empty: none). Raises ``json.JSONDecodeError``
    for text that is not JSON, ``SettingsNotExact`` and ``SettingsShapeError`` with what
    is wrong, in one line."""
    if not text.strip():
        return {}
    try:
        settings = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                              parse_float=_finite_float, parse_int=_finite_int)
    except RecursionError:
        raise SettingsNotExact(f"nested deeper than {MAX_DEPTH} levels") from None
    if _depth(settings) > MAX_DEPTH:
        raise SettingsNotExact(f"nested deeper than {MAX_DEPTH} levels")
    if not isinstance(settings, dict):
        raise SettingsShapeError("holds no JSON object")
    return settings


def settings_text(settings: dict[str, Any]) -> str:
    """The settings as the file's text."""
    return json.dumps(settings, indent=2, allow_nan=False) + "\n"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SettingsNotExact(f"the key {json.dumps(key)} appears twice in one object; only one would be kept")
        seen[key] = value
    return seen


def _no_constant(name: str) -> Any:
    raise SettingsNotExact(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SettingsNotExact(f"the number {text[:40]} is too large to write back (it would become Infinity)")
    return value


def _finite_int(text: str) -> int:
    if len(text) > 4000:  # Python's own limit on converting digits; the file would not be JSON a reader takes
        raise SettingsNotExact(f"the number {text[:20]}… has {len(text)} digits, too many to write back")
    return int(text)


def _depth(value: Any) -> int:
    """How deep objects and lists nest in ``value`` (counted without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def is_ours(hook: Any) -> bool:
    return isinstance(hook, dict) and any(ours in str(hook.get("command", "")) for ours in OUR_COMMANDS)


def with_our_hooks(settings: dict[str, Any], command: str) -> dict[str, Any]:
    """The settings with one hook of ours on every event (a previous one of ours is
    replaced, so installing twice changes nothing)."""
    merged = without_our_hooks(settings)
    hooks = merged.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsShapeError('"hooks" is not an object')
    for event in HOOK_EVENTS:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise SettingsShapeError(f'"hooks.{event}" is not a list')
        groups.append({"matcher": "", "hooks": [{"type": "command", "command": command,
                                                 "timeout": TIMEOUT_SECONDS}]})
    return merged


def without_our_hooks(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with every hook of ours taken out, and the groups and events that
    held only ours; anything else stays."""
    result = copy.deepcopy(settings)
    hooks = result.get("hooks")
    if not isinstance(hooks, dict):
        return result
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept = []
        for group in groups:
            inner = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(inner, list) or not any(is_ours(h) for h in inner):
                kept.append(group)
                continue
            rest = [h for h in inner if not is_ours(h)]
            if rest:
                kept.append({**group, "hooks": rest})
        if kept or not groups:
            hooks[event] = kept
        else:
            del hooks[event]  # it held only ours
    if not hooks and settings["hooks"]:
        del result["hooks"]  # it held only ours
    return result
