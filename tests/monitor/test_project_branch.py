"""Each source's session start names its project (the working directory's last part)
and git branch where it gives them, with or without --retain-payloads; a malformed
branch is left out and never costs the line that starts the session."""

from __future__ import annotations

import json

import pytest

from tests.monitor.support import events, jsonl
from tillerman.ledger.events import ThreadStarted
from tillerman.monitor.appserver_events import AppServerEvents

CWD = "/home/ann/acme-shop"
SID = "0199a1b2-0000-7000-8000-00000000aa01"


def rollout(**meta) -> bytes:
    return jsonl(json.dumps({"timestamp": "2026-11-30T00:00:00.000Z", "type": "session_meta",
                             "payload": {"id": SID, **meta}}))


def transcript(**line) -> bytes:
    return jsonl(json.dumps({"type": "user", "uuid": "u1", "sessionId": SID, "timestamp": "2026-11-30T00:00:00.000Z",
                             "message": {"role": "user", "content": "hi"}, **line}))


def hook(**record) -> bytes:
    return jsonl(json.dumps({"hook_event_name": "UserPromptSubmit", "session_id": SID, "prompt": "hi", **record}))


def appserver(**thread) -> list:
    return AppServerEvents().normalize({"method": "thread/started", "params": {"thread": {"id": SID, **thread}}})


CASES = {
    "codex rollout": (lambda: events("codex-rollout", rollout(cwd=CWD, git={"branch": "fix-login", "commit_hash": "a"})),
                      ("acme-shop", "fix-login")),
    "codex rollout, a git object that is not one": (lambda: events("codex-rollout", rollout(cwd=CWD, git=["x"])),
                                                     ("acme-shop", None)),
    "codex rollout, no cwd": (lambda: events("codex-rollout", rollout(git={"branch": "main"})), (None, "main")),
    "claude transcript": (lambda: events("claude-transcript", transcript(cwd=CWD, gitBranch="main"),
                                         source=f"/p/{SID}.jsonl"), ("acme-shop", "main")),
    "claude transcript, an empty branch (no repository)": (
        lambda: events("claude-transcript", transcript(cwd=CWD, gitBranch=""), source=f"/p/{SID}.jsonl"),
        ("acme-shop", None)),
    "claude hooks (no branch given)": (lambda: events("claude-hooks", hook(cwd=CWD)), ("acme-shop", None)),
    "app-server": (lambda: appserver(cwd=CWD, gitInfo={"sha": "a", "branch": "dev", "originUrl": None}),
                   ("acme-shop", "dev")),
    "app-server, a branch that is not a name": (lambda: appserver(cwd=CWD, gitInfo={"branch": 7}), ("acme-shop", None)),
}


@pytest.mark.parametrize("case", CASES)
def test_project_and_branch_are_kept_without_payloads(case):
    read, expected = CASES[case]
    started = next(e for e in read() if isinstance(e, ThreadStarted))
    assert (started.project or None, started.git_branch or None) == expected
    assert started.cwd is None  # the path itself stays out without --retain-payloads
