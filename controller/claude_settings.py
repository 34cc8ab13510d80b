"""tillerman's hook entries in Claude Code's ``settings.json``: merged in beside the
user's own, and taken out again, exactly. Pure: a settings object in, a new one out.

Claude Code's shape: ``{"hooks": {"<Event>": [{"matcher": "...", "hooks": [{"type":
"command", "command": "...", "timeout": s}]}]}}``. Ours are told apart by their
command, which runs ``tillerman hook claude`` (or its bare module); every other key, event, group and
hook is left as it was, in its order.
"""

from __future__ import annotations

import copy
from typing import Any

HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "PostToolUse",
               "PostToolUseFailure", "Stop", "StopFailure", "SubagentStop", "Notification", "PreCompact",
               "SessionEnd")
HOOK_MODULE = "tillerman.controller.claude_hook"  # what an installed hook runs
OUR_COMMANDS = (HOOK_MODULE, "tillerman hook claude")
TIMEOUT_SECONDS = 10  # a hook that only appends a line; Claude Code's own default is 60


class SettingsShapeError(ValueError):
    """The settings hold something other than Claude Code's hook shape where ours go."""


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
