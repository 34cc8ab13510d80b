"""What Claude Code runs on every hook event once ``tillerman hooks install --claude``
has put it in the settings: ``python -m tillerman.controller.claude_hook --spool DIR``
(``tillerman hook claude`` does the same through the CLI). It keeps the payload and
answers nothing, so the agent goes on as if no hook were there; it imports nothing
beyond the standard library, because it starts once per event and Claude Code waits.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

MAX_PAYLOAD = 16 * 1024 * 1024
_SESSION_NAME = re.compile(r"[A-Za-z0-9-]{1,128}")


def default_spool() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tillerman" / "claude-hooks"


def keep_payload(raw: bytes, spool: Path) -> Path:
    """Appends the payload as one line (one write on an O_APPEND file: hooks that run at
    once never interleave their lines). Returns the file."""
    if len(raw) > MAX_PAYLOAD:
        raise ValueError(f"the payload is over {MAX_PAYLOAD} bytes")
    payload = json.loads(raw)
    if not isinstance(payload, dict):
        raise ValueError("the payload is not a JSON object")
    session = payload.get("session_id")
    name = session if isinstance(session, str) and _SESSION_NAME.fullmatch(session) else "unknown-session"
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = spool / f"{name}.jsonl"
    line = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def main(argv: list[str]) -> int:
    """Exits 0 whatever happens: a hook of ours never stops the agent (what went wrong
    goes to stderr)."""
    spool = Path(argv[argv.index("--spool") + 1]) if "--spool" in argv[:-1] else default_spool()
    try:
        keep_payload(sys.stdin.buffer.read(MAX_PAYLOAD + 1), spool)
    except (OSError, ValueError, RecursionError) as exc:
        print(f"tillerman hook claude: payload not kept ({exc}); the session goes on", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
