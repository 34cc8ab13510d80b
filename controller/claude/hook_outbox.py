"""The outbox of a Claude Code session supervised through its hooks: the intents the
daemon has decided to deliver to it, in one small JSON file beside the session's spool
file (``<spool>/<session_id>.outbox.json``).

The daemon is the only place that decides; the hook (``tillerman.controller.claude.hook``)
is the transport. When the policy authorizes an intent for a thread seen through the
hooks, the daemon writes it here (written beside and renamed into place, so a hook never
reads half a file); when the intent is no longer deliverable (claimed, cancelled, held by
a hazard) it is taken out again. A hook reads only this file, never the ledger, until it
finds an intent for the point it runs at: then it claims it in the ledger
(``tillerman.controller.claude.hook_claim``) and prints the decision.

Standard library only (``tillerman.ledger.paths`` is too): the hook imports it at every
event, and Claude Code waits.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from tillerman.ledger.errors import UnsafeOutput
from tillerman.ledger.paths import NotARegularFile, check_output, read_regular, replace_file

log = logging.getLogger(__name__)

#: Where an intent is delivered: the Stop hook (a queued message, at the turn's end) or
#: the PreToolUse hook (a steer that asked for ``deliver_at = "pre_tool_use"``).
AT_STOP, AT_PRE_TOOL_USE = "Stop", "PreToolUse"
SUFFIX = ".outbox.json"  # not ``.jsonl``: the spool's followers never read it as a session
#: The most an outbox may hold: a few parcels of a few KiB each; more is not the daemon's.
MAX_OUTBOX = 4 << 20


@dataclass(frozen=True)
class Parcel:
    """One decided intent, with what the hook needs to deliver it and claim it."""

    intent_id: str
    at: str  # AT_STOP | AT_PRE_TOOL_USE
    text: str  # what the agent reads: the intent's delivered text
    expected_turn: str | None = None  # a steer: only in this turn (the payload's prompt_id)
    # The other ids the session's sources give that turn (its transcript names it by a
    # message uuid): a turn the daemon knew first by one of those is still the hook's turn.
    turn_aliases: tuple[str, ...] = ()

    def in_turn(self, prompt_id: str | None) -> bool:
        return self.expected_turn is None or (prompt_id is not None
                                              and prompt_id in (self.expected_turn, *self.turn_aliases))


@dataclass(frozen=True)
class Outbox:
    ledger: str  # the ledger the claim is written to
    parcels: tuple[Parcel, ...] = ()

    def for_event(self, event: str, prompt_id: str | None) -> list[Parcel]:
        """The parcels a hook running at ``event`` in turn ``prompt_id`` may deliver, oldest first."""
        return [p for p in self.parcels if p.at == event and p.in_turn(prompt_id)]


def outbox_path(spool: Path, session_id: str) -> Path:
    return spool / f"{session_id}{SUFFIX}"


def write_outbox(path: Path, outbox: Outbox) -> None:
    """Replace the outbox atomically; an empty one is removed (a hook finds no file: the
    cheapest answer). Where the outbox may not be written (a FIFO, a symlink to a ledger
    …, ``tillerman.ledger.paths``) it is not, and a warning says so: its intents then
    expire undelivered, as they would with no hook at all."""
    if not outbox.parcels:
        path.unlink(missing_ok=True)
        return
    body = {"ledger": outbox.ledger, "parcels": [asdict(p) for p in outbox.parcels]}
    try:
        target = check_output(path, "the outbox", ledgers=[outbox.ledger])
    except UnsafeOutput as exc:
        log.warning("%s", exc)
        return
    replace_file(target, lambda new: new.write_text(json.dumps(body)), mode=0o600)


class OutboxUnreadable(ValueError):
    """Something other than an outbox the daemon could have written is at its name."""


def read_outbox(path: Path) -> Outbox | None:
    """The outbox, or None when there is none (or it does not parse: the hook then
    answers nothing). Read only from a regular file of at most ``MAX_OUTBOX`` bytes,
    opened so that it cannot block (``read_regular``): Claude Code waits on the hook, and
    a FIFO at this name would hold it for ever. Anything else there raises
    ``OutboxUnreadable``, for the hook to say in one line and answer nothing."""
    try:
        raw, _ = read_regular(path, limit=MAX_OUTBOX + 1)
    except (FileNotFoundError, NotADirectoryError):  # no outbox; a spool that is no folder is the spool's to say
        return None
    except (OSError, NotARegularFile) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise OutboxUnreadable(f"cannot read the outbox {path}: {why}") from None
    if len(raw) > MAX_OUTBOX:
        raise OutboxUnreadable(f"the outbox {path} is larger than {MAX_OUTBOX >> 20} MiB; the daemon writes no such file")
    try:
        body = json.loads(raw)
        parcels = tuple(Parcel(intent_id=str(p["intent_id"]), at=str(p["at"]), text=str(p["text"]),
                               expected_turn=p.get("expected_turn"),
                               turn_aliases=tuple(str(a) for a in p.get("turn_aliases", ())))
                        for p in body["parcels"])
        return Outbox(ledger=str(body["ledger"]), parcels=parcels)
    except (ValueError, KeyError, TypeError):
        return None
