"""The disagreement set: where a candidate rule set would have acted differently from
the active one, over the same recorded sessions or ledger.

Each input file is replayed twice through ``tillerman.controller.replay.replayer.Replayer`` (same
normalizer, same Step, same policy, same virtual clock, an in-memory ledger each),
once per rule set, and what each run's rules did is collected as **acts**:

* a report (``report_overdue``, ``observe``, or a dispatch action reported because it
  could not become an intent), keyed by the finding that made it;
* a proposed intent, with the first decision the policy made about it (``observe
  replayed_would_steer``: it would have been dispatched; ``escalate no_grant``:
  refused; ``observe_critical approval_pending``: held …);
* a shadow rule's finding, with the shadow decision recorded for it.

Acts are matched by a stable key: the intent id derived from the finding key (rule
id, thread, turn, condition instance), the same in both runs for the same finding.
Two acts agree when the rule's action, its shadow flag and the first decision are
the same; a rule version change that does not change behaviour is no disagreement.
Rule-review reports (review dates) are about the files, not the sessions: left out.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from tillerman.controller.core.timefmt import iso
from tillerman.controller.replay.replayer import Replayer, collect_files
from tillerman.ledger import events as ev
from tillerman.ledger.intents import intent_id_from
from tillerman.rules.config import Effective

if TYPE_CHECKING:
    from tillerman.ledger.sqlite import SQLiteRecorder


class Act(msgspec.Struct, frozen=True, kw_only=True):
    rule_id: str
    rule_version: int
    action: str  # the rule's action
    shadow: bool = False
    decision: str | None = None  # "observe replayed_would_steer", for intents and shadow decisions
    finding: str = ""

    @property
    def summary(self) -> str:
        what = f"shadow {self.action}" if self.shadow else self.action
        return f"{what} ({self.decision})" if self.decision else f"{what} (reported)"

    def same(self, other: Act) -> bool:
        return (self.action, self.shadow, self.decision) == (other.action, other.shadow, other.decision)


class Disagreement(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "only_active" | "only_candidate" | "changed"
    rule_id: str
    file: str
    thread: str | None
    turn: str | None
    at: str | None
    key: str
    active: Act | None
    candidate: Act | None


class DiffReport(msgspec.Struct, kw_only=True):
    active_digest: str
    candidate_digest: str
    inputs: list[str]
    acts: dict[str, int]  # "active" / "candidate": how many acts each set made
    agreements: int
    only_active: int
    only_candidate: int
    changed: int
    by_rule: dict[str, dict[str, int]]
    disagreements: list[Disagreement]


class _Where(msgspec.Struct, frozen=True):
    thread: str | None
    turn: str | None
    at: float | None


def collect_acts(recorder: SQLiteRecorder) -> dict[str, tuple[Act, _Where]]:
    """The acts in one replay's ledger, by key."""
    acts: dict[str, tuple[Act, _Where]] = {}
    decisions: dict[str, str] = {}
    for entry in recorder.read():
        event, at = entry.envelope.event, entry.envelope.at
        if isinstance(event, ev.Report) and event.detail.get("kind") != "rule_review":
            key = intent_id_from(entry.envelope.event_id.removeprefix("report:"))
            act = Act(rule_id=event.rule_id, rule_version=event.rule_version,
                      action=str(event.detail.get("action", "report")), shadow=bool(event.detail.get("shadow")),
                      finding=event.finding)
            acts[key] = (act, _Where(event.thread_id, event.turn_id, at))
        elif isinstance(event, ev.IntentProposed) and event.intent.rule_id is not None:
            intent = event.intent
            act = Act(rule_id=intent.rule_id, rule_version=intent.rule_version or 0, action=intent.mode,
                      finding=intent.text)
            acts[intent.id] = (act, _Where(intent.thread_id, intent.expected_turn_id, at))
        elif isinstance(event, ev.DecisionRecorded) and event.rule_id is not None:
            decisions.setdefault(event.intent_id, f"{event.action} {event.reason}")
    return {key: (msgspec.structs.replace(act, decision=decisions.get(key)), where)
            for key, (act, where) in acts.items()}


def _replay(path: Path, effective: Effective) -> dict[str, tuple[Act, _Where]]:
    from tillerman.ledger.sqlite import SQLiteRecorder  # only when `rules diff` runs

    with SQLiteRecorder(":memory:") as recorder:
        Replayer(recorder, effective.ruleset, patterns=effective.patterns).run([str(path)])
        return collect_acts(recorder)


def diff(active: Effective, candidate: Effective, paths: list[str]) -> DiffReport:
    """Replay every file under ``paths`` with both sets and compare what they did."""
    files = collect_files(paths)
    found: list[Disagreement] = []
    counts: Counter[str] = Counter()
    agreements = 0
    for path in files:
        mine, theirs = _replay(path, active), _replay(path, candidate)
        counts["active"] += len(mine)
        counts["candidate"] += len(theirs)
        for key in sorted(set(mine) | set(theirs)):
            a, c = mine.get(key), theirs.get(key)
            if a is not None and c is not None and a[0].same(c[0]):
                agreements += 1
                continue
            kind = "changed" if a and c else "only_active" if a else "only_candidate"
            act, where = a or c
            found.append(Disagreement(
                kind=kind, rule_id=act.rule_id, file=str(path), thread=where.thread, turn=where.turn,
                at=iso(where.at), key=key, active=a[0] if a else None, candidate=c[0] if c else None))
    found.sort(key=lambda d: (d.rule_id, d.file, d.at or "", d.key))
    by_rule: dict[str, dict[str, int]] = {}
    for item in found:
        row = by_rule.setdefault(item.rule_id, {"only_active": 0, "only_candidate": 0, "changed": 0})
        row[item.kind] += 1
    kinds = Counter(d.kind for d in found)
    return DiffReport(
        active_digest=active.ruleset.digest, candidate_digest=candidate.ruleset.digest,
        inputs=[str(p) for p in files], acts={"active": counts["active"], "candidate": counts["candidate"]},
        agreements=agreements, only_active=kinds["only_active"], only_candidate=kinds["only_candidate"],
        changed=kinds["changed"], by_rule=dict(sorted(by_rule.items())), disagreements=found,
    )
