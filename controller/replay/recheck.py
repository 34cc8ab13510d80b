"""``tillerman replay --check LEDGER``: decide again every decision a ledger records, with
the policy of this tillerman and the rule set that decided then, and name the first one
that comes out differently.

A recorded decision is the value ``decide(intent, state, snapshot, now, ruleset)``
returned in the daemon's round (``tillerman.controller.core.supervisor.Step.decide_intents``),
and each of its inputs is in the ledger before it:

* the intent, its state and its thread's snapshot: the fold of every entry before the
  decision's seq. A round decides on the fold of the whole ledger and appends its
  decisions (each with the terminal move it settles) in one batch, in intent order, so
  the entries of that batch before a decision are other intents' decisions and moves,
  which change neither this intent nor any thread snapshot;
* ``now``: the decision's own ``at``;
* the rule set: the one whose digest the decision names, rebuilt from the text a
  ``ruleset_loaded`` recorded (``tillerman.rules.ruleset.ruleset_from_text``). Looked up
  by digest over the whole ledger, not only before the decision: at a start the daemon
  may decide before its ``ruleset_loaded`` is written.

Not re-decided: shadow decisions (``shadow=True``). Their intent is never recorded; it is
built from a detection finding at that moment, so deciding one again means detecting
again, which this check does not do. They are counted.

What it cannot see: a moment where the policy under test would have decided but the
recorded one decided nothing new (only changes of decision are recorded), and a
decision another process raced (an ``intent cancel`` committed between the daemon's fold
and its write) is judged on a fold the daemon had not seen, so it may show as a
difference.

Pure core (``check``): entries in, a ``CheckResult`` out. ``check_ledger`` is the edge:
it opens the file, refuses a damaged one, and reads the entries.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import msgspec

from tillerman.ledger import events as ev
from tillerman.ledger.backends import open_recorder
from tillerman.ledger.errors import LedgerError
from tillerman.ledger.events import Entry
from tillerman.ledger.location import is_database_url, shown
from tillerman.ledger.projections import Projection
from tillerman.rules.policy import decide
from tillerman.rules.prices import PriceFileError
from tillerman.rules.ruleset import RuleSet, ruleset_from_text

_SQLITE_MAGIC = b"SQLite format 3\x00"


class CannotCheck(Exception):
    """Input the check cannot judge: not a ledger, a damaged one, or a decision whose
    rule set the ledger does not hold."""

    exit_code = 2


class Verdict(msgspec.Struct, frozen=True):
    action: str
    reason: str


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    at: float | None
    intent: str
    thread: str | None
    recorded: Verdict
    redecided: Verdict
    ruleset_digest: str | None


class CheckResult(msgspec.Struct, kw_only=True):
    ok: bool
    entries: int  # entries read (up to the first difference)
    decisions: int  # decisions decided again
    shadow_decisions: int  # not decided again (see the module docstring)
    rulesets: int  # rule sets the ledger recorded with their text
    first_difference: Difference | None = None
    notes: list[str] = []
    ledger: str | None = None


class RecordedRulesets(msgspec.Struct, kw_only=True):
    """Every rule set a ledger recorded, by the digest it was recorded under; None for a
    set recorded without its text (or with text this version cannot read: ``why``)."""

    sets: dict[str, RuleSet | None]
    why: dict[str, str] = {}
    notes: list[str] = []


def recorded_rulesets(entries: Iterable[Entry]) -> RecordedRulesets:
    found = RecordedRulesets(sets={})
    for entry in entries:
        event = entry.envelope.event
        if not isinstance(event, ev.RulesetLoaded) or found.sets.get(event.digest) is not None:
            continue
        if event.ruleset_text is None:
            found.sets[event.digest] = None
            continue
        try:
            ruleset = ruleset_from_text(event.ruleset_text)
        except msgspec.DecodeError as exc:
            found.sets[event.digest] = None
            found.why[event.digest] = f"its text at seq {entry.seq} cannot be read by this version ({exc})"
            continue
        except PriceFileError as exc:  # its cost budgets need the imported price table, which is spoiled
            found.sets[event.digest] = None
            found.why[event.digest] = f"its budgets' price table cannot be read ({exc})"
            continue
        if ruleset.digest != event.digest:
            # The same rules and grants, digested differently: the digest formula or the
            # rule structs changed since. Deciding with them is still the question asked.
            found.notes.append(f"the rule set recorded at seq {entry.seq} as {event.digest} rebuilds as"
                               f" {ruleset.digest}")
        found.sets[event.digest] = ruleset
    return found


def check(entries: Iterable[Entry], rulesets: RecordedRulesets) -> CheckResult:
    """Fold the entries in seq order and decide again at each recorded decision; stop
    at the first that differs. Raises ``CannotCheck`` at a decision with no rule set
    to decide it with, or about an intent no earlier entry proposes."""
    projection = Projection()
    in_force: str | None = None  # the digest of the last ruleset_loaded: for a decision naming none
    decisions = shadows = count = 0
    difference = None
    for entry in entries:
        count += 1
        event = entry.envelope.event
        if isinstance(event, ev.RulesetLoaded):
            in_force = event.digest
        elif isinstance(event, ev.DecisionRecorded) and event.shadow:
            shadows += 1
        elif isinstance(event, ev.DecisionRecorded):
            decisions += 1
            difference = _redecide(projection, entry, event, rulesets, event.ruleset_digest or in_force)
            if difference is not None:
                break
        projection.apply(entry)
    notes = list(rulesets.notes)
    if projection.undecodable:
        notes.append(f"{len(projection.undecodable)} rows could not be decoded and were skipped (first: seq"
                     f" {min(projection.undecodable)}); decisions after them were judged on a fold without them")
    return CheckResult(ok=difference is None, entries=count, decisions=decisions, shadow_decisions=shadows,
                       rulesets=sum(1 for s in rulesets.sets.values() if s is not None),
                       first_difference=difference, notes=notes)


def _redecide(projection: Projection, entry: Entry, event: ev.DecisionRecorded, rulesets: RecordedRulesets,
              digest: str | None) -> Difference | None:
    ruleset = rulesets.sets.get(digest) if digest is not None else None
    if ruleset is None:
        raise CannotCheck(f"seq {entry.seq}: the decision about intent {event.intent_id} was made under rule set"
                          f" {digest or '(unnamed)'}, {_missing(digest, rulesets)}; nothing to decide it"
                          " again with")
    view = projection.intents.get(event.intent_id)
    if view is None:
        raise CannotCheck(f"seq {entry.seq}: a decision about intent {event.intent_id}, which no earlier entry"
                          " proposes; `tillerman ledger verify` lists rows it cannot decode")
    at = entry.envelope.at if entry.envelope.at is not None else entry.envelope.observed_at
    decision = decide(view.intent, view.state, projection.snapshot(view.intent.thread_id), at or 0.0, ruleset)
    recorded = Verdict(event.action, event.reason)
    redecided = Verdict(decision.action.value, decision.reason)
    if redecided == recorded:
        return None
    return Difference(seq=entry.seq, at=at, intent=event.intent_id, thread=view.intent.thread_id,
                      recorded=recorded, redecided=redecided, ruleset_digest=digest)


def _missing(digest: str | None, rulesets: RecordedRulesets) -> str:
    if digest in rulesets.why:
        return rulesets.why[digest]
    if digest in rulesets.sets:
        return "which the ledger records by its digest only (written before rule sets were recorded)"
    return "which no ruleset_loaded in the ledger names (a replay into a ledger records none)"


# -- the edge: one ledger (a SQLite file or a PostgreSQL database) ----------------------------------------------------------


def check_ledger(path: str | Path, *, progress: Callable[[int, int], None] | None = None) -> CheckResult:
    """Check a ledger file, read-only. ``progress(seq, last_seq)`` is called as it goes.
    A file that is not a ledger, or a ledger whose chain does not verify (its history is
    not the recorded one), raises ``CannotCheck``."""
    if is_database_url(path):  # a PostgreSQL ledger: shown without its password
        path, location = shown(str(path)), path
    else:
        path = location = Path(path)
        _refuse_non_ledger(path)
    try:
        with open_recorder(location, readonly=True, must_exist=True) as ledger:
            report = ledger.verify()
            if not report.ok:
                raise CannotCheck(f"{path}: the ledger is damaged ({report.problems[0]}); its history is not the"
                                  f" recorded one. `tillerman ledger verify --ledger {path}` says more")
            rulesets = recorded_rulesets(ledger.read())  # rule sets stay in the live file when threads are archived
            # the whole history: the decisions of archived threads are in the ledger's segments
            result = check(_reporting(ledger.history(), report.last_seq, progress), rulesets)
    except LedgerError as exc:
        raise CannotCheck(f"{path}: not a readable tillerman ledger ({exc})") from exc
    result.ledger = str(path)
    return result


def _refuse_non_ledger(path: Path) -> None:
    """Only a regular file that starts as SQLite: a FIFO is never opened (it would block)."""
    if not path.is_file():
        raise CannotCheck(f"{path}: not a ledger file; give the path of a tillerman ledger (SQLite)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise CannotCheck(f"{path}: cannot read ({os.strerror(exc.errno) if exc.errno else exc})") from exc
    if head != _SQLITE_MAGIC:
        raise CannotCheck(f"{path}: not a tillerman ledger (not an SQLite file); --check reads a ledger,"
                          " not a session file or a `ledger export`")


def _reporting(entries: Iterable[Entry], last: int, progress: Callable[[int, int], None] | None) -> Iterator[Entry]:
    for entry in entries:
        if progress is not None and entry.seq % 1024 == 0:
            progress(entry.seq, last)
        yield entry
