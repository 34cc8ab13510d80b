"""Synthetic, realistic Codex rollouts (0.163 format) for the replay benchmarks.

Deterministic per seed: the same (lines, seed) always writes the same bytes. The
shape follows the recorded fixtures (``fixtures/sessions/codex-rollout``): a
``session_meta``; then turns of ``task_started``, ``turn_context``, the user's
message (``response_item`` + ``item_completed``), tool calls (``function_call``,
``token_count``, ``item_completed CommandExecution`` with its output,
``function_call_output``), reasoning, the agent's message, ``task_complete``.
Now and then a command fails — sometimes the same one three times in a turn, so
the repeated-failure rule fires and proposes steers — a turn is aborted, or the
stream reports an error. Output sizes vary (most small, a few tens of KB), as real
tool output does.

    python -m bench.sessions OUT.jsonl LINES [SEED]
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from datetime import datetime, timedelta, timezone

THREAD_PREFIX = "01a229c4-3717-7c10-9d2e-"
START = datetime(2026, 11, 30, 0, 0, 0, tzinfo=timezone.utc)
WORDS = ("the", "build", "fails", "in", "module", "parser", "tests", "config", "read", "file", "error",
         "fix", "update", "import", "path", "cache", "retry", "check", "value", "return", "run", "src")
COMMANDS = ("pytest -q tests/{w}", "rg -n {w} src", "cat src/{w}.py", "ls -la src/{w}", "make {w}",
            "git diff -- src/{w}.py", "python -m {w}", "sed -n 1,80p src/{w}.py")


def rollout_name(seed: int) -> str:
    return f"rollout-2026-11-30T00-00-00-{thread_id(seed)}.jsonl"


def thread_id(seed: int) -> str:
    return f"{THREAD_PREFIX}{seed:012x}"


class _Writer:
    def __init__(self, fh, seed: int) -> None:
        self.fh = fh
        self.rnd = random.Random(seed)
        self.now = START
        self.lines = 0
        self.ordinal = 0
        self.ids = 0

    def line(self, kind: str, payload: dict) -> None:
        self.now += timedelta(milliseconds=self.rnd.randrange(1, 1500))
        stamp = self.now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.now.microsecond // 1000:03d}Z"
        record = {"timestamp": stamp, "ordinal": self.ordinal, "type": kind, "payload": payload}
        self.fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.ordinal += 1
        self.lines += 1

    def uid(self) -> str:
        self.ids += 1
        return str(uuid.UUID(int=(self.rnd.getrandbits(64) << 64) | self.ids))

    def words(self, lo: int, hi: int) -> str:
        return " ".join(self.rnd.choice(WORDS) for _ in range(self.rnd.randint(lo, hi)))

    def output_text(self) -> str:
        r = self.rnd.random()
        size = self.rnd.randint(0, 200) if r < 0.6 else self.rnd.randint(200, 3000) if r < 0.95 \
            else self.rnd.randint(3000, 40_000)
        text = self.words(1, 12)
        return (text + "\n") * max(1, size // (len(text) + 1))


def write_rollout(path: str, lines: int, seed: int = 1) -> int:
    """Write about ``lines`` lines (whole turns); return the exact count."""
    with open(path, "w") as fh:
        w = _Writer(fh, seed)
        thread = thread_id(seed)
        w.line("session_meta", {
            "session_id": thread, "id": thread, "timestamp": "2026-11-30T00:00:00.000Z", "cwd": "/work/ws",
            "originator": "bench", "cli_version": "0.163.0", "source": "vscode", "model_provider": "mock",
            "base_instructions": {"text": "You are a coding agent running in the Codex CLI. " * 40},
            "history_mode": "paginated"})
        while w.lines < lines:
            _turn(w, thread)
        return w.lines


def _turn(w: _Writer, thread: str) -> None:
    rnd = w.rnd
    turn = w.uid()
    w.line("event_msg", {"type": "task_started", "turn_id": turn, "model_context_window": 272000,
                         "turn_attribution": {"turn_id": turn, "turn_trigger": None, "parent_turn_id": None}})
    w.line("turn_context", {"turn_id": turn, "cwd": "/work/ws", "approval_policy": "never",
                            "sandbox_policy": {"type": "danger-full-access"}, "model": "mock-model"})
    said = w.words(4, 40)
    w.line("response_item", {"type": "message", "id": f"msg_{w.uid()}", "role": "user",
                             "content": [{"type": "input_text", "text": said}]})
    w.line("event_msg", {"type": "item_completed", "thread_id": thread, "turn_id": turn, "item": {
        "type": "UserMessage", "id": w.uid(), "client_id": None,
        "content": [{"type": "text", "text": said, "text_elements": []}]}})
    # A flaky command is retried as-is in some turns: three failures trip the rule.
    flaky = rnd.random() < 0.04
    calls = rnd.randint(3, 6) if flaky else rnd.randint(0, 6)
    for i in range(calls):
        if flaky and i < 3:
            command, code = "pytest -q tests/test_flaky.py", 1
        else:
            command = rnd.choice(COMMANDS).format(w=rnd.choice(WORDS))
            code = 0 if rnd.random() < 0.9 else rnd.choice((1, 2, 127))
        if rnd.random() < 0.5:
            w.line("response_item", {"type": "reasoning", "id": f"rs_{w.uid()}", "summary": [],
                                     "encrypted_content": "gAAAA" + "x" * rnd.randint(100, 1500)})
        call = f"call-{w.uid()}"
        w.line("response_item", {"type": "function_call", "name": "exec_command",
                                 "arguments": json.dumps({"cmd": command}), "call_id": call})
        w.line("event_msg", {"type": "token_count", "info": {"total_token_usage": {
            "input_tokens": rnd.randint(1000, 90000), "output_tokens": rnd.randint(10, 4000)}}, "rate_limits": None})
        output = w.output_text()
        w.line("event_msg", {"type": "item_completed", "thread_id": thread, "turn_id": turn, "item": {
            "type": "CommandExecution", "id": call, "process_id": str(rnd.randint(1000, 99999)),
            "command": ["/bin/bash", "-lc", command], "cwd": "file:///work/ws", "source": "unified_exec_startup",
            "status": "completed" if code == 0 else "failed", "aggregated_output": output, "exit_code": code,
            "duration": {"secs": rnd.randint(0, 30), "nanos": rnd.randint(0, 999_999_999)}}})
        w.line("response_item", {"type": "function_call_output", "call_id": call, "output":
                                 f"Chunk ID: {rnd.getrandbits(16):04x}\nWall time: 1.0 seconds\n"
                                 f"Process exited with code {code}\nOutput:\n{output[:2000]}"})
    r = rnd.random()
    if r < 0.02:
        w.line("event_msg", {"type": "stream_error", "message": "stream disconnected before completion"})
    if r < 0.05:
        w.line("event_msg", {"type": "turn_aborted", "turn_id": turn, "reason": "interrupted"})
        return
    answer = w.words(5, 80)
    w.line("response_item", {"type": "message", "id": f"msg_{w.uid()}", "role": "assistant",
                             "content": [{"type": "output_text", "text": answer}]})
    w.line("event_msg", {"type": "item_completed", "thread_id": thread, "turn_id": turn, "item": {
        "type": "AgentMessage", "id": w.uid(), "content": [{"type": "Text", "text": answer}]}})
    w.line("event_msg", {"type": "token_count", "info": None, "rate_limits": None})
    w.line("event_msg", {"type": "task_complete", "turn_id": turn, "duration_ms": rnd.randint(500, 600_000),
                         "last_agent_message": answer[:200]})


if __name__ == "__main__":
    out, count = sys.argv[1], int(sys.argv[2])
    print(write_rollout(out, count, int(sys.argv[3]) if len(sys.argv) > 3 else 1))
