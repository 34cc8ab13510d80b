"""What Claude Code runs on every hook event once ``tillerman hooks install --claude``
has put it in the settings: ``python -m tillerman.controller.claude_hook --spool DIR``
(``tillerman hook claude`` does the same through the CLI). It keeps the payload and, as
a rule, answers nothing, so the agent goes on as if no hook were there; it imports
nothing beyond the standard library (and ``tillerman.ledger.paths``, which is too),
because it starts once per event and Claude Code waits.

It speaks only to deliver what the daemon decided: at a ``Stop`` or a ``PreToolUse``,
when the session's outbox (``tillerman.controller.claude.hook_outbox``) holds an intent for
that point, it claims the intent in the ledger (``tillerman.controller.claude.hook_claim``,
loaded only then) and prints Claude Code's answer: ``{"decision": "block", "reason":
<text>}`` at a Stop (the agent continues the turn with the text), a ``deny`` with the
text as the reason at a PreToolUse (the tool does not run; the agent reads the text as
its result). One intent per answer; a claim that fails (the intent moved, or the
ledger stayed busy past ``CLAIM_BUSY_MS``) delivers nothing. What it answered, or that
it failed open, is kept on the payload's own spool line (key ``tillerman``), the record
the daemon reads back; a delivery whose line cannot be kept is not made.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from tillerman.controller.claude.hook_outbox import AT_PRE_TOOL_USE, AT_STOP, OutboxUnreadable, outbox_path, read_outbox
from tillerman.controller.core.printable import printable
from tillerman.ledger.paths import open_for_append

MAX_PAYLOAD = 16 * 1024 * 1024
CLAIM_BUDGET = 5.0  # seconds of claims per hook at most: Claude Code's limit for ours is 10
_SESSION_NAME = re.compile(r"[A-Za-z0-9-]{1,128}")


def default_spool() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tillerman" / "claude-hooks"


def read_payload(raw: bytes) -> dict:
    if len(raw) > MAX_PAYLOAD:
        raise ValueError(f"the payload is over {MAX_PAYLOAD} bytes")
    payload = json.loads(raw)
    if not isinstance(payload, dict):
        raise ValueError("the payload is not a JSON object")
    return payload


def session_name(payload: dict) -> str:
    session = payload.get("session_id")
    return session if isinstance(session, str) and _SESSION_NAME.fullmatch(session) else "unknown-session"


def keep_payload(raw: bytes | dict, spool: Path) -> Path:
    """Appends the payload as one line (one write on an O_APPEND file: hooks that run at
    once never interleave their lines). Returns the file. A spool file that may not be
    written (a FIFO, a symlink to a ledger …, ``tillerman.ledger.paths``) is refused."""
    payload = raw if isinstance(raw, dict) else read_payload(raw)
    name = session_name(payload)
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = spool / f"{name}.jsonl"
    line = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
    fd = open_for_append(path, "the spool file", mode=0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def deliver(payload: dict, spool: Path) -> tuple[dict | None, dict | None]:
    """Claude Code's answer for this event (None: no decision) and the record of what was
    answered, for the spool line (None: nothing to deliver here)."""
    event = payload.get("hook_event_name")
    if event not in (AT_STOP, AT_PRE_TOOL_USE):
        return None, None
    try:
        outbox = read_outbox(outbox_path(spool, session_name(payload)))
    except OutboxUnreadable as exc:  # a FIFO or a device there: never waited on, nothing delivered
        _say(f"tillerman hook claude: {printable(exc)}; nothing delivered at this event")
        outbox = None
    prompt_id = payload.get("prompt_id") if isinstance(payload.get("prompt_id"), str) else None
    parcels = outbox.for_event(event, prompt_id) if outbox is not None else []
    if not parcels:
        return None, None
    from tillerman.controller.claude import hook_claim  # only now: the ledger's imports cost time

    started = time.monotonic()
    for parcel in parcels:  # the oldest this hook can claim; a claimed one is skipped
        if time.monotonic() - started > CLAIM_BUDGET:
            return None, {"fail_open": "claim_budget_spent", "intent_id": parcel.intent_id}
        claim = hook_claim.claim(outbox.ledger, parcel.intent_id, event=event, turn_id=prompt_id)
        if claim.claimed:
            record = {"delivered": parcel.intent_id, "attempt": claim.attempt, "text": parcel.text}
            return _answer(event, parcel.text), record
        if not claim.why.startswith("moved"):
            # The ledger is busy or broken: no claim, no delivery; the agent goes on.
            return None, {"fail_open": claim.why, "intent_id": parcel.intent_id}
    return None, None


def _answer(event: str, text: str) -> dict:
    if event == AT_STOP:
        return {"decision": "block", "reason": text}
    return {"hookSpecificOutput": {"hookEventName": AT_PRE_TOOL_USE, "permissionDecision": "deny",
                                   "permissionDecisionReason": text}}


class HookUsageError(ValueError):
    """Options the hook cannot act on."""


class AnswerNotWritten(OSError):
    """The payload's line is kept, but Claude Code closed the pipe the answer goes to."""


def spool_from(argv: list[str]) -> Path:
    """The spool the options name (``--spool DIR``, ``--spool=DIR``; none: the default).
    Parsed here rather than by click: click's usage error exits 2, which Claude Code
    reads as "block this action", so a wrong option would stop the agent."""
    spool = None
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--spool="):
            spool = arg.removeprefix("--spool=")
        elif arg == "--spool":
            if not rest:
                raise HookUsageError("--spool needs a folder")
            spool = rest.pop(0)
        else:
            raise HookUsageError(f"unknown option {arg!r}; the only one is --spool DIR")
    if spool == "":  # Path("") is the working directory: the agent's project
        raise HookUsageError("--spool '' names no folder")
    return default_spool() if spool is None else Path(spool)


def keep_and_answer(argv: list[str]) -> None:
    """Keep the payload on stdin and print the decision, if any, once its line is kept."""
    spool = spool_from(argv)
    if sys.stdin is None:  # started with stdin closed
        raise ValueError("no stdin to read it from")
    payload = read_payload(sys.stdin.buffer.read(MAX_PAYLOAD + 1))
    try:
        answer, record = deliver(payload, spool)
    except Exception as exc:  # noqa: BLE001 - a failed delivery still keeps the payload
        answer, record = None, {"fail_open": f"{type(exc).__name__}: {exc}"}
    keep_payload({**payload, "tillerman": record} if record is not None else payload, spool)
    if answer is not None:
        try:
            print(json.dumps(answer), flush=True)
        except OSError as exc:
            _stdout_to_devnull()
            raise AnswerNotWritten(exc.strerror or str(exc)) from exc


def _stdout_to_devnull() -> None:
    """The answer a failed write left in stdout's buffer would be written again as the
    interpreter exits, fail again, and add a traceback to our one line on stderr."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str]) -> int:
    """Exits 0 whatever happens, bad options included: Claude Code reads exit 2 as
    "block this action", and a hook of ours never stops the agent. What went wrong is
    one line on stderr."""
    try:
        keep_and_answer(argv)
    except AnswerNotWritten as exc:
        _say(f"tillerman hook claude: payload kept, its answer not written ({printable(exc)}); the session goes on")
    except Exception as exc:  # noqa: BLE001 - whatever broke, the agent goes on undisturbed
        # One line, whatever the error says: its control characters (a newline, an escape
        # sequence from a path) are shown as codes, never acted on by a terminal.
        _say(f"tillerman hook claude: payload not kept ({printable(exc) or type(exc).__name__}); the session goes on")
    return 0


def _say(line: str) -> None:
    if sys.stderr is None:  # started with stderr closed: nowhere to say it
        return
    try:
        print(line, file=sys.stderr)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
