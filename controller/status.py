"""``tillerman status``: who owns the ledger, what it sees, what is open or overdue."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import msgspec

from controller.daemon import HEARTBEAT
from controller.overdue import overdue
from controller.rpc_errors import CHECKED_CODEX_VERSIONS
from controller.timefmt import iso
from ledger import projections
from ledger.recorder import Recorder


def ledger_status(recorder: Recorder, ledger_path: Path, now: float) -> dict:
    projection = projections.load(recorder)
    threads = []
    for thread_id in sorted(projection.threads):
        snap = projection.snapshot(thread_id)
        threads.append({
            "thread": thread_id,
            "steerable": snap.steerable,  # False: followed through files only, cannot be steered
            "active_turn": snap.active_turn_id,
            "status": projection.threads[thread_id].status,
            "flags": list(projection.threads[thread_id].flags),
            "approval_pending": snap.approval_pending,
            "critical_tool": snap.critical_tool,
            "external_effect_unknown": snap.external_effect_unknown,
            "queue": len(snap.queue),
            "queue_paused": snap.queue_paused,
        })
    return {
        "ledger": str(ledger_path),
        "daemon": _daemon(recorder, ledger_path),
        "threads": threads,
        "open_intents": len(projection.open_intents()),
        "overdue": len(overdue(projection, now)),
        "last_seq": projection.seq,
    }


def _daemon(recorder: Recorder, ledger_path: Path) -> dict:
    beat = recorder.load_snapshot(HEARTBEAT)
    info = msgspec.json.decode(beat[1]) if beat else {}
    version = info.get("server_version")
    return {
        "running": _lock_held(Path(f"{ledger_path}.lock")),
        "pid": info.get("pid"),
        "since": iso(info.get("since")),
        "heartbeat": iso(info.get("heartbeat")),
        "url": info.get("url"),
        "watch": info.get("watch", []),
        "connected": info.get("connected", False),
        "server_version": version,  # of the Codex app-server last attached to
        "originator": info.get("originator"),
        "server_version_checked": None if version is None else version in CHECKED_CODEX_VERSIONS,
    }


def version_warning(daemon: dict) -> str | None:
    """A line for a server release the error classification was not checked against:
    its refusals may be worded differently, and an unrecognized one is settled by
    readback (a wait) instead of being rejected at once."""
    if daemon.get("server_version_checked") is not False:
        return None
    return (f"warning: Codex {daemon['server_version']} is not a release tillerman's error classification was"
            f" checked against ({', '.join(CHECKED_CODEX_VERSIONS)}); a refusal worded differently is settled"
            " by readback instead of at once")


def _lock_held(lock_path: Path) -> bool:
    """Whether a daemon holds the ledger's lock right now (probing never takes it for long)."""
    if not lock_path.exists():
        return False
    fd = os.open(lock_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
