"""The fleet: one row per supervised thread, those that need a person first.

A pure function of the ledger's projection, its usage account and the time now: the
page, its live updates and its tests all call ``fleet_rows`` with what they read.
"""

from __future__ import annotations

import msgspec

#: A thread's state as a person reads it, in the order the fleet shows them: what needs
#: a person first. ``waiting``: an approval waits on the owner; ``stalled``: a turn runs
#: but nothing has moved for the stall window; ``working``: a turn runs; ``idle``: no
#: turn runs; ``stopped``: a stop intent stopped it; ``done``: its session ended.
STATES = ("waiting", "stalled", "working", "idle", "stopped", "done")


class FleetRow(msgspec.Struct, frozen=True, kw_only=True):
    thread_id: str
    name: str  # what a person recognises: its title, its first prompt's digest, else its cwd; never only the id
    project: str | None  # the cwd's last part
    branch: str | None  # the git branch, where known
    agent: str  # "codex" | "claude"
    source: str  # "codex live", "claude hooks", "claude wrapper", "claude transcript", "codex rollout", ...
    state: str  # one of STATES
    state_since: float | None  # when it entered that state
    running_tool: str | None  # the command or tool running now
    running_since: float | None
    goal_status: str | None  # Codex's thread goal, where it has one
    tokens_today: int  # input + output counted today (the owner's zone)
    cost_today_usd: float | None  # None: a response today with no known price
    context_use: float | None  # the last response's input over its model's context window
    open_intents: int
    overdue: int
    last_event_at: float | None
    last_event: str | None  # its kind, as a person reads it
