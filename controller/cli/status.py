"""``tillerman status``: who owns the ledger, what it sees, what is open or overdue."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import msgspec

from tillerman.controller.core.overdue import overdue
from tillerman.controller.core.render import goal_json, trigger_counts
from tillerman.controller.core.rpc_errors import CHECKED_CODEX_VERSIONS
from tillerman.controller.core.timefmt import iso
from tillerman.controller.daemon.link import HEARTBEAT
from tillerman.ledger import projections
from tillerman.ledger.projections import ThreadState
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.reviews import fold_reviews
from tillerman.rules.policy import capabilities


def ledger_status(recorder: Recorder, ledger_path: Path | str, now: float) -> dict:
    """``ledger_path``: a SQLite file's path, or a database ledger's URL as shown."""
    projection = projections.load(recorder)
    threads, housekeeping = [], 0
    for thread_id in sorted(projection.threads):
        snap = projection.snapshot(thread_id)
        if not snap.supervised:  # Codex's ephemeral title-generation threads: no one's work
            housekeeping += 1
            continue
        threads.append({
            "thread": thread_id,
            "steerable": snap.steerable,  # a connection steers it (an app-server, tillerman claude)
            "takes": list(capabilities(snap)),  # the intents it can be sent: the policy decides by the same
            "via": _transport(projection.threads[thread_id]),
            "active_turn": snap.active_turn_id,
            "status": projection.threads[thread_id].status,
            "flags": list(projection.threads[thread_id].flags),
            "approval_pending": snap.approval_pending,
            "critical_tool": snap.critical_tool,
            "external_effect_unknown": snap.external_effect_unknown,
            "queue": len(snap.queue),
            "queue_paused": snap.queue_paused,
            "goal": goal_json(snap.goal),  # Codex's thread goal: its status, budget and use
            "recent_turn_triggers": trigger_counts(projection.threads[thread_id]),
            # The stop intent that stopped it (docs/goals.md "Stopping a thread"), until a
            # person resumed it: meanwhile rules' and reviewers' intents wait.
            "stopped_by": snap.stopped_by,
            **writers_status(projection.threads[thread_id]),
        })
    return {
        "ledger": str(ledger_path),
        "daemon": _daemon(recorder),
        "threads": threads,
        "unsupervised_threads": housekeeping,
        "open_intents": len(projection.open_intents()),
        "overdue": len(overdue(projection, now)),
        "last_seq": projection.seq,
        "undecodable": {str(seq): why for seq, why in sorted(projection.undecodable.items())},
        "flagged_reviewers": flagged_reviewers(recorder),
        # several daemons on one PostgreSQL ledger: who they are, who holds which thread, until when
        "daemons": [dict(d, since=iso(d["since"]), renewed_at=iso(d["renewed_at"])) for d in _daemons(recorder)],
        "leases": [dict(lease, expires_at=iso(lease["expires_at"])) for lease in _leases(recorder)],
    }


def writers_status(thread: ThreadState) -> dict:
    """Several writers on the thread (``tillerman.ledger.writers``): who opened its recent
    turns, whether another writer's message folded into the running turn is unanswered
    (tillerman's steer and queue wait), and the latest facts."""
    return {
        "turn_writers": dict(Counter(thread.turn_writers.values())),
        "other_writer_input": thread.other_input is not None,
        "writer_facts": [{"kind": f.kind, "turn": f.turn_id, "other_turn": f.other_turn_id, "item": f.item_id,
                          "at": iso(f.at) if f.at is not None else None} for f in thread.writer_facts],
    }


def writer_lines(thread: dict) -> list[str]:
    """What ``tillerman status`` says of the thread's writers, one line per fact."""
    lines = [f"thread {thread['thread']}: another writer's message was folded into turn {thread['active_turn']}"
             " and is not answered yet; tillerman's steers and queued messages wait"] \
        if thread["other_writer_input"] else []
    for fact in thread["writer_facts"]:
        if fact["kind"] == "overlapping_turn":
            lines.append(f"thread {thread['thread']}: turn {fact['turn']} started at {fact['at']} while turn"
                         f" {fact['other_turn']} was still running (two writers' turns at once)")
        else:
            lines.append(f"thread {thread['thread']}: another writer's message ({fact['item']}) was folded into"
                         f" running turn {fact['turn']} at {fact['at']}")
    return lines


def state_text(thread: dict) -> str | None:
    """The STATUS cell: Codex's status of the thread, and "stopped" while a stop holds it."""
    if thread["stopped_by"] is None:
        return thread["status"]
    return f"{thread['status'] or '-'}, stopped"


def stopped_lines(thread: dict) -> list[str]:
    """What ``tillerman status`` says of a stopped thread."""
    if thread["stopped_by"] is None:
        return []
    return [f"thread {thread['thread']}: stopped by intent {thread['stopped_by']}; rules' and reviewers' steers,"
            " queued messages and interrupts wait until a person resumes it (a turn of their own, the goal set"
            " active, or an intent of their own)"]


def _transport(thread: ThreadState) -> str | None:
    """What carries intents to the thread (None: followed through files only)."""
    if thread.wrapped:
        return "claude-wrapper"
    if thread.steerable:
        return "app-server"
    return "claude-hooks" if thread.hook_delivery else None


def flagged_reviewers(recorder: Recorder) -> dict[str, list[str]]:
    """Reviewers that let a known-bad calibration probe through -> those probes' checkpoint ids."""
    return fold_reviews(recorder.read()).flagged()


def _leases(recorder: Recorder) -> list[dict]:
    """The database's thread leases (a SQLite ledger has none: one daemon owns it all)."""
    return leases.all() if (leases := recorder.leases()) is not None else []


def _daemons(recorder: Recorder) -> list[dict]:
    """Every daemon sharing the database, with its last renewal (none on a SQLite ledger)."""
    return leases.daemons() if (leases := recorder.leases()) is not None else []


def _daemon(recorder: Recorder) -> dict:
    beat = recorder.load_snapshot(HEARTBEAT)
    try:
        info = msgspec.json.decode(beat[1]) if beat else {}
    except msgspec.DecodeError:
        info = {}  # an unreadable heartbeat says as much as none: nothing about the daemon
    if not isinstance(info, dict):
        info = {}
    return {
        "running": recorder.daemon_running(),  # a SQLite ledger's lock held; on a database, any daemon renewing
        "pid": info.get("pid"),
        "since": iso(info.get("since")),
        "heartbeat": iso(info.get("heartbeat")),
        "watch": info.get("watch", []),
        "watch_waiting": info.get("watch_waiting", []),  # --watch directories that do not exist (yet)
        "codex": _codex(info.get("codex")),
        "ledger_outage": _outage(info.get("ledger_outage")),
    }


def _outage(outage: dict | None) -> dict | None:
    """The daemon's latest time without its ledger (``tillerman.controller.daemon.ledger_health``):
    since, until (None: still going on when it last beat), the first error."""
    if not isinstance(outage, dict):
        return None
    return {"since": iso(outage.get("since")), "until": iso(outage.get("until")), "error": outage.get("error")}


def _codex(link: dict | None) -> dict | None:
    """The daemon's app-server connection (``tillerman.controller.daemon.link``), times as ISO-8601, and
    whether its server is a release the error classification was checked against."""
    if not isinstance(link, dict):
        return None
    version = link.get("server_version")
    return {**link, "since": iso(link.get("since")),
            "server_version_checked": None if version is None else version in CHECKED_CODEX_VERSIONS}


def version_warning(codex: dict | None) -> str | None:
    """A line for a server release the error classification was not checked against:
    its refusals may be worded differently, and an unrecognized one is settled by
    readback (a wait) instead of being rejected at once."""
    if not codex or codex.get("server_version_checked") is not False:
        return None
    return (f"warning: Codex {codex['server_version']} is not a release tillerman's error classification was"
            f" checked against ({', '.join(CHECKED_CODEX_VERSIONS)}); a refusal worded differently is settled"
            " by readback instead of at once")
