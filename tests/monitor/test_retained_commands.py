"""A shell call's command is kept in ``ItemStarted.command`` only with --retain-payloads,
cut to ``COMMAND_LENGTH``, in every format that gives it; a tool that is no shell command
keeps no command; without retaining, the row encodes as it did before commands were kept."""

import json

import msgspec
import pytest

from tests.monitor.support import events, jsonl
from tillerman.ledger.events import ItemStarted, encode
from tillerman.monitor.appserver_events import AppServerEvents
from tillerman.monitor.digest import COMMAND_LENGTH

SID = "7f3c2a10-5b4e-4d21-9c8a-1e2f3a4b5c6d"
HOSTILE = "echo '<script>alert(1)</script>' && git push"


def rollout(*payloads: dict) -> bytes:
    return jsonl(json.dumps({"timestamp": "2026-11-30T00:00:00.000Z", "type": "event_msg",
                             "payload": {"type": "task_started", "turn_id": "T"}}),
                 *(json.dumps({"timestamp": "2026-11-30T00:00:01.000Z", "type": t, "payload": p})
                   for t, p in payloads))


def transcript(*blocks: dict) -> bytes:
    return jsonl(
        json.dumps({"type": "user", "sessionId": SID, "uuid": "u1", "timestamp": "2026-11-30T00:51:58.080Z",
                    "isSidechain": False, "message": {"role": "user", "content": "go"}}),
        json.dumps({"type": "assistant", "sessionId": SID, "uuid": "a1", "isSidechain": False,
                    "timestamp": "2026-11-30T00:51:59.080Z",
                    "message": {"role": "assistant", "content": list(blocks), "stop_reason": None}}))


def hook(tool: str, tool_input: dict, tool_use_id: str) -> bytes:
    return jsonl(json.dumps({"session_id": SID, "hook_event_name": "PreToolUse", "tool_name": tool,
                             "tool_input": tool_input, "tool_use_id": tool_use_id}))


def appserver(item: dict):
    def started(retain: bool) -> list:
        return AppServerEvents(retain_payloads=retain).normalize(
            {"method": "item/started", "params": {"threadId": "th", "turnId": "tu", "item": item}})
    return started


def parsed(fmt: str, data: bytes):
    return lambda retain: events(fmt, data, retain_payloads=retain)


#: (what, events with or without retaining, the call's item id, the command kept when retained)
CASES = [
    ("app-server commandExecution", appserver({"type": "commandExecution", "id": "c1", "command": HOSTILE,
                                               "status": "inProgress"}), "c1", HOSTILE),
    ("app-server mcpToolCall", appserver({"type": "mcpToolCall", "id": "m1", "server": "s", "tool": "t",
                                          "status": "inProgress"}), "m1", None),
    ("rollout exec_command", parsed("codex-rollout", rollout(
        ("response_item", {"type": "function_call", "name": "exec_command", "call_id": "c1",
                           "arguments": json.dumps({"cmd": HOSTILE})}))), "c1", HOSTILE),
    ("rollout shell function_call", parsed("codex-rollout", rollout(
        ("response_item", {"type": "function_call", "name": "shell", "call_id": "c1",
                           "arguments": json.dumps({"command": ["bash", "-lc", "make test"]})}))),
     "c1", "bash -lc make test"),
    ("rollout local_shell_call", parsed("codex-rollout", rollout(
        ("response_item", {"type": "local_shell_call", "call_id": "c1", "status": "completed",
                           "action": {"type": "exec", "command": ["ls", "-la"]}}))), "c1", "ls -la"),
    ("rollout exec_command_begin", parsed("codex-rollout", rollout(
        ("event_msg", {"type": "exec_command_begin", "call_id": "c1", "command": ["git", "status"]}))),
     "c1", "git status"),
    ("rollout other function_call", parsed("codex-rollout", rollout(
        ("response_item", {"type": "function_call", "name": "apply_patch_tool", "call_id": "c1",
                           "arguments": "{}"}))), "c1", None),
    ("transcript Bash", parsed("claude-transcript", transcript(
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": HOSTILE}})), "t1", HOSTILE),
    ("transcript Read", parsed("claude-transcript", transcript(
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/etc/passwd"}})), "t1", None),
    ("hooks Bash", parsed("claude-hooks", hook("Bash", {"command": HOSTILE}, "t1")), "t1", HOSTILE),
    ("hooks Edit", parsed("claude-hooks", hook("Edit", {"file_path": "a.py"}, "t1")), "t1", None),
]


def _started(run, retain: bool, item_id: str) -> ItemStarted:
    [started] = [e for e in run(retain) if isinstance(e, ItemStarted) and e.item_id == item_id]
    return started


@pytest.mark.parametrize(("what", "run", "item_id", "command"), CASES, ids=[c[0] for c in CASES])
def test_the_command_is_kept_only_when_retained_and_only_for_shell_calls(what, run, item_id, command):
    retained, private = _started(run, True, item_id), _started(run, False, item_id)
    assert retained.command == (msgspec.UNSET if command is None else command)
    assert private.command is msgspec.UNSET
    assert b'"command"' not in encode(private)  # old rows and non-retaining runs keep their bytes
    assert msgspec.structs.replace(retained, command=msgspec.UNSET) == private  # nothing else differs


def test_a_long_command_is_cut():
    long = "echo " + "x" * (COMMAND_LENGTH * 2)
    started = _started(parsed("claude-hooks", hook("Bash", {"command": long}, "t1")), True, "t1")
    assert started.command == long[:COMMAND_LENGTH]
