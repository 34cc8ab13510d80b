"""Notices for people: what each ``[[notify]]`` sink is sent, and when.

Four kinds of things are worth a person's attention: an **overdue** intent (past its
acknowledgement or effect deadline, ``tillerman.controller.core.overdue``), an **escalation**
(the policy handed an intent to a person: ``decision`` rows with action ``escalate``),
a **report** a rule made for a person (a stall, an approval waiting: ``report`` rows
whose action is ``report_overdue`` or ``escalate``), and a Codex **goal** that Codex
stopped working on by itself for a reason a person has to act on (``budgetLimited``,
``usageLimited``, ``blocked``: ``snapshot.GOAL_HALTED``), told without any rule; and a
thread's **usage** crossing a day's cost or most of its context window, also without a
rule (``tillerman.controller.notify.usage_report``). Each is a
*subject* (``overdue:INTENT``, ``escalation:INTENT``, ``report:EVENT``, ``goal:EVENT``,
the event that changed the goal's status) with a *step* (the deadline missed, the
escalation's reason, ``1`` for a report, the goal's status). A sink gets each step
once, and once more (``resolved``) when the subject settles: the intent reaches a final
state or a person resolves its notice (``NoticeResolved``, settled ``owner_resolved``:
a deadline missed after that is a new notice), the report's turn ends or the thread
moves again, the goal's status changes.
Without a sink taking goals, each such goal change is logged once, and its settling. Notices of one thread that fall due
within the sink's ``group_window`` go in one hand-over; with ``repeat``, an unresolved
step is sent again that often. With the dashboard's address configured (``[dashboard]
url``), each notice carries ``link``, its thread's page there.

Pure: ``fold`` reads ledger rows (reports, escalations, and the sinks' own
``notification_sent`` / ``notification_failed`` rows), ``due`` says which hand-overs are
due now, ``next_due`` when the next one will be. What was sent is read back from the
ledger, so a restart neither repeats a notice nor loses a resolved one; the fold state
is kept in a snapshot (``save``/``load``) so a start reads only the tail.
``tillerman.controller.notify.sinks`` does the sending and records every attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import quote

import msgspec

from tillerman.controller.core.notice_resolution import KIND as RESOLUTION_KIND
from tillerman.controller.core.notice_resolution import Resolution, resolutions
from tillerman.controller.core.overdue import OVERDUE_SUBJECT, Overdue, overdue, overdue_subject, resolution_covers
from tillerman.controller.core.render import overdue_json
from tillerman.controller.core.timefmt import iso
from tillerman.controller.notify.usage_report import UsageReport, describe
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry
from tillerman.ledger.intent_states import is_terminal
from tillerman.ledger.projections import Projection
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.reviews import REVIEW_HELD
from tillerman.ledger.snapshot import GOAL_CLEARED, GOAL_HALTED
from tillerman.rules.notify import NoticeKind, NotifySink

log = logging.getLogger("tillerman")

SNAPSHOT_NAME = "notify"
RESOLVED = "resolved"
OWNER_RESOLVED = "owner_resolved"  # how an overdue notice a person resolved settled
#: Report rows meant for a person (``observe`` is only recorded).
_PERSON_ACTIONS = frozenset({"report_overdue", "escalate"})


class Alert(msgspec.Struct, kw_only=True):
    """A subject with something to tell: its current step and what identifies it."""

    kind: NoticeKind
    thread_id: str
    step: str
    at: float  # when it was seen (a report's time: the thread moving after it resolves it)
    facts: dict[str, str | int | float | bool | None] = {}


class Notice(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    keys: tuple[str, ...]  # the steps this notice covers: a step and its resolution may go together
    body: dict


class Handover(msgspec.Struct, frozen=True, kw_only=True):
    """One group of notices for one sink and one thread."""

    sink: NotifySink
    thread_id: str
    notices: tuple[Notice, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for notice in self.notices for key in notice.keys)

    def payload(self) -> dict:
        if self.sink.per_notice:
            return self.notices[0].body
        return {"sink": self.sink.name, "thread": self.thread_id, "notices": [n.body for n in self.notices]}


class _State(msgspec.Struct, kw_only=True):
    """What the ledger says so far: the fold ``save`` keeps."""

    seq: int = 0
    alerts: dict[str, Alert] = {}  # subject -> alert
    sent: dict[str, dict[str, float]] = {}  # sink -> key -> last sent (or given up) at
    goals: dict[str, str] = {}  # thread -> its goal's last status: a report with the same one is no change
    usage_marks: dict[str, str] = {}  # the usage crossings already reported (``UsageReport.crossings``)
    resolved: dict[str, Resolution] = {}  # overdue subject -> a person's latest resolution of it


def key_of(subject: str, step: str) -> str:
    return f"{subject}@{step}"


class Notifier:
    def __init__(self, sinks: Iterable[NotifySink], usage_report: UsageReport | None = None,
                 dashboard_url: str | None = None) -> None:
        self.sinks = tuple(sinks)
        self.dashboard_url = dashboard_url  # None: no link in the notices
        self.usage_report = usage_report  # None: [defaults] usage_report = false
        self._usage_moved: set[str] = set()  # threads with usage folded since the last ``due``
        self.kinds = frozenset(kind for sink in self.sinks for kind in sink.kinds)  # what any sink takes
        self.state = _State()
        self.in_flight: dict[str, set[str]] = {sink.name: set() for sink in self.sinks}
        self._groups: dict[tuple[str, str], float] = {}  # (sink, thread) -> when its window opened
        self._logged: set[str] = set()  # overdue intents logged by this run
        self._next: float | None = None
        self.overdue_now = 0  # intents overdue as of the last ``due``

    # -- the fold -------------------------------------------------------------------

    def fold(self, entry: Entry) -> None:
        if entry.seq <= self.state.seq:
            return
        self.state.seq = entry.seq
        event = entry.envelope.event
        if isinstance(event, ev.GoalUpdated | ev.GoalCleared) and event.thread_id is not None:
            self._fold_goal(entry, event)  # logged without a sink too
        if isinstance(event, ev.Usage) and self.usage_report is not None and event.thread_id is not None:
            self._usage_moved.add(event.thread_id)  # judged from the fold's figures when notices are due
        if isinstance(event, ev.NoticeResolved) and event.subject.startswith(OVERDUE_SUBJECT):
            self.state.resolved.update(resolutions((entry,)))  # without a sink too: no longer counted as overdue
        if not self.sinks:
            return
        at = entry.envelope.at or 0.0
        if isinstance(event, ev.Report) and "report" in self.kinds and event.thread_id is not None \
                and not event.detail.get("shadow") and event.detail.get("action") in _PERSON_ACTIONS:
            self.state.alerts[f"report:{entry.envelope.event_id}"] = Alert(
                kind="report", thread_id=event.thread_id, step="1", at=at,
                facts={"turn": event.turn_id, "rule": event.rule_id, "finding": event.finding})
        elif isinstance(event, ev.DecisionRecorded) and "escalation" in self.kinds and event.action == "escalate" \
                and not event.shadow and event.thread_id is not None:
            self.state.alerts[f"escalation:{event.intent_id}"] = Alert(
                kind="escalation", thread_id=event.thread_id, step=event.reason, at=at,
                facts={"intent": event.intent_id, "reason": event.reason, "rule": event.rule_id})
        elif isinstance(event, ev.IntentEvidence) and "escalation" in self.kinds and event.reason == REVIEW_HELD:
            # A review that failed closed or said hold/escalate: the intent waits on its
            # owner now, who is told as of an escalation (the checkpoint names the step).
            self.state.alerts[f"escalation:{event.intent_id}"] = Alert(
                kind="escalation", thread_id=event.thread_id, step=f"review_held:{event.evidence.get('checkpoint')}",
                at=at, facts={"intent": event.intent_id, "reason": REVIEW_HELD, **{
                    k: event.evidence.get(k) for k in ("reviewer", "outcome", "disposition")}})
        elif isinstance(event, ev.NotificationSent | ev.NotificationFailed):
            self._fold_outcome(event, at)

    def _fold_goal(self, entry: Entry, event: ev.GoalUpdated | ev.GoalCleared) -> None:
        """A change of a thread's goal into a halted status opens a subject; a report with
        the status it already had (every turn's end, a ``thread/goal/get``) opens none."""
        status = event.status if isinstance(event, ev.GoalUpdated) else GOAL_CLEARED
        before = self.state.goals.get(event.thread_id)
        if before is None and status == GOAL_CLEARED:
            return  # Codex clears on every resume of a thread that has no goal: nothing to keep
        self.state.goals[event.thread_id] = status
        if status not in GOAL_HALTED or status == before:
            return
        env = entry.envelope
        changed_at = env.at if env.at is not None else env.observed_at  # as the fold times the change
        self.state.alerts[f"goal:{env.event_id}"] = Alert(
            kind="goal", thread_id=event.thread_id, step=status, at=env.at or 0.0,
            facts={"status": status, "token_budget": event.token_budget, "tokens_used": event.tokens_used,
                   "time_used_seconds": event.time_used_seconds, "turn": event.turn_id, "changed_at": changed_at})

    def _fold_outcome(self, event: ev.NotificationSent | ev.NotificationFailed, at: float) -> None:
        flying = self.in_flight.get(event.sink)
        if isinstance(event, ev.NotificationFailed) and event.retry_in is not None:
            return  # the sink's runner tries again: still in flight
        sent = self.state.sent.setdefault(event.sink, {})
        for key in event.keys:
            sent[key] = at
            if flying is not None:
                flying.discard(key)
            subject, _, step = key.rpartition("@")
            kind, _, intent_id = subject.partition(":")
            if kind == "overdue" and subject not in self.state.alerts and step != RESOLVED and event.thread:
                # an overdue intent notified before a restart: only its resolution is left to say
                self.state.alerts[subject] = Alert(kind="overdue", thread_id=event.thread, step=step, at=at,
                                                   facts={"intent": intent_id})
        self._forget_finished()

    def _forget_finished(self) -> None:
        """Drop a subject once every sink that takes its kind has its resolution: the
        fold stays as small as what is still open."""
        for subject, alert in list(self.state.alerts.items()):
            takers = [s.name for s in self.sinks if alert.kind in s.kinds]
            if takers and all(key_of(subject, RESOLVED) in self.state.sent.get(name, {}) for name in takers):
                del self.state.alerts[subject]
                for name in takers:
                    sent = self.state.sent.get(name, {})
                    for key in [k for k in sent if k.rpartition("@")[0] == subject]:
                        del sent[key]

    # -- what is due ----------------------------------------------------------------

    def due(self, projection: Projection, now: float) -> list[Handover]:
        """The hand-overs due now; each of their keys counts as in flight until its
        ``notification_sent`` (or a final ``notification_failed``) is folded."""
        found = overdue(projection, now, {subject: r.at for subject, r in self.state.resolved.items()})
        self.overdue_now = len(found)
        self._log(found, projection)
        self._log_goals(projection)
        self._usage_crossings(projection, now)
        if not self.sinks:
            return []
        current: dict[str, dict] = {}
        for item in found if "overdue" in self.kinds else ():
            subject = overdue_subject(item.intent_id)
            current[subject] = overdue_json(item)
            self.state.alerts[subject] = Alert(kind="overdue", thread_id=item.thread_id, step=item.deadline,
                                               at=now, facts={"intent": item.intent_id})
        self._drop_untold(projection, current)
        out: list[Handover] = []
        self._next = None
        for sink in self.sinks:
            by_thread: dict[str, list[Notice]] = {}
            for subject, alert in self.state.alerts.items():
                if alert.kind in sink.kinds:
                    notice = self._notice(sink, subject, alert, projection, current, now)
                    if notice is not None:
                        by_thread.setdefault(alert.thread_id, []).append(notice)
            for thread_id, notices in sorted(by_thread.items()):
                opened = self._groups.setdefault((sink.name, thread_id), now)
                if now < opened + sink.group_window:
                    self._wake_at(opened + sink.group_window)
                    continue
                del self._groups[(sink.name, thread_id)]
                groups = [(notice,) for notice in notices] if sink.per_notice else [tuple(notices)]
                for group in groups:
                    handover = Handover(sink=sink, thread_id=thread_id, notices=group)
                    self.in_flight[sink.name].update(handover.keys)
                    out.append(handover)
            for group in [g for g in self._groups if g[0] == sink.name and g[1] not in by_thread]:
                del self._groups[group]  # everything it waited for settled or went out meanwhile
        return out

    def _drop_untold(self, projection: Projection, current: dict[str, dict]) -> None:
        """An intent no longer overdue, or a report already settled, before any sink was
        told of it has nothing left to tell a person: forgotten, not sent as resolved. An
        escalation is the news itself (a refusal settles at once): it is sent resolved."""
        for subject, alert in list(self.state.alerts.items()):
            if alert.kind == "escalation" or (subject in current if alert.kind == "overdue"
                                              else self._settled(alert, projection, subject) is None):
                continue
            step_key = key_of(subject, alert.step)
            if not any(step_key in self.state.sent.get(n, {}) or step_key in self.in_flight[n] for n in self.in_flight):
                del self.state.alerts[subject]

    def next_due(self) -> float | None:
        """When ``due`` next has something to hand over with no new ledger row (a group
        window closing, a repeat), as of the last ``due``."""
        return self._next

    def _wake_at(self, when: float) -> None:
        self._next = when if self._next is None else min(self._next, when)

    def _notice(self, sink: NotifySink, subject: str, alert: Alert, projection: Projection,
                current: dict[str, dict], now: float) -> Notice | None:
        sent, flying = self.state.sent.get(sink.name, {}), self.in_flight[sink.name]
        step_key, resolved_key = key_of(subject, alert.step), key_of(subject, RESOLVED)
        if resolved_key in sent or resolved_key in flying or step_key in flying:
            return None
        body = {"kind": alert.kind, "step": alert.step, **self._body(alert, subject, projection, current)}
        if self.dashboard_url is not None:
            body["link"] = thread_link(self.dashboard_url, alert.thread_id)
        settled = self._settled(alert, projection, subject)
        if settled is not None:  # a step not sent yet goes with its resolution, in one notice
            keys = (resolved_key,) if step_key in sent else (step_key, resolved_key)
            if settled == OWNER_RESOLVED:
                resolution = self.state.resolved[subject]
                body.update(resolved_by=resolution.by, resolution_note=resolution.note)
            return Notice(subject=subject, keys=keys, body={**body, "resolved": True, "settled": settled})
        if alert.kind == "overdue" and subject not in current:
            return None  # between steps (acknowledged, no effect deadline missed yet)
        last = sent.get(step_key)
        if last is not None:
            if sink.repeat is None:
                return None
            if now < last + sink.repeat:
                self._wake_at(last + sink.repeat)
                return None
        return Notice(subject=subject, keys=(step_key,), body={**body, "resolved": False, "repeat": last is not None})

    @staticmethod
    def _body(alert: Alert, subject: str, projection: Projection, current: dict[str, dict]) -> dict:
        if subject in current:
            return current[subject]
        facts = {"thread": alert.thread_id, **alert.facts}
        view = projection.intents.get(str(alert.facts.get("intent")))
        if view is not None:
            facts.update(state=view.state, mode=view.intent.mode, owner=view.intent.owner)
        if alert.kind == "overdue":
            facts["deadline"] = alert.step  # as in the overdue notice itself
        if alert.kind == "report":
            facts["report"] = subject.partition(":")[2]
            facts["reported_at"] = iso(alert.at)
        if alert.kind == "goal":
            facts["changed_at"] = iso(alert.facts.get("changed_at"))
        if alert.kind == "usage":
            facts["reported_at"] = iso(alert.at)
        return facts

    def _settled(self, alert: Alert, projection: Projection, subject: str) -> str | None:
        """How the subject settled (an intent's final state, a report's turn ending or
        its thread moving on), or None while it is still open."""
        if alert.kind == "goal":
            return _goal_settled(alert, projection)
        if alert.kind == "usage":
            return self.usage_report.settled(alert.thread_id, alert.facts, projection) if self.usage_report else "off"
        if alert.kind == "report":
            snapshot = projection.snapshot(alert.thread_id)
            if snapshot.active_turn_id != alert.facts.get("turn"):
                return "turn_ended"
            if snapshot.last_progress_at is not None and snapshot.last_progress_at > alert.at:
                return "progress"
            return None
        view = projection.intents.get(str(alert.facts.get("intent")))
        if view is not None and is_terminal(view.state, view.intent):
            return str(view.state)
        if view is not None and _covered(view.intent, alert.step, self.state.resolved.get(subject)):
            return OWNER_RESOLVED
        return None

    def _log(self, found: list[Overdue], projection: Projection) -> None:
        """Every overdue intent is logged once per run, and its settling once more."""
        for item in found:
            if item.intent_id not in self._logged:
                self._logged.add(item.intent_id)
                log.warning("overdue: intent %s on thread %s (%s, %s deadline): %s%s", item.intent_id,
                            item.thread_id, item.state, item.deadline, item.why,
                            f" ({thread_link(self.dashboard_url, item.thread_id)})" if self.dashboard_url else "")
        for intent_id in list(self._logged):
            view = projection.intents.get(intent_id)
            if view is not None and is_terminal(view.state, view.intent):
                self._logged.discard(intent_id)
                log.info("resolved: overdue intent %s settled as %s", intent_id, view.state)

    def _usage_crossings(self, projection: Projection, now: float) -> None:
        """The built-in usage report's new crossings, each logged once and kept as a
        subject when a sink takes usage notices."""
        if self.usage_report is None:
            return
        told = any("usage" in sink.kinds for sink in self.sinks)
        for thread_id in sorted(self._usage_moved):
            thread = projection.threads.get(thread_id)
            if thread is None or thread.usage is None:
                continue
            for subject, step, facts in self.usage_report.crossings(thread_id, thread.usage, self.state.usage_marks,
                                                                    now):
                log.warning("%s", describe(thread_id, facts))
                if told:
                    self.state.alerts[subject] = Alert(kind="usage", thread_id=thread_id, step=step, at=now,
                                                       facts=facts)
        self._usage_moved.clear()

    def _log_goals(self, projection: Projection) -> None:
        """Every goal subject is logged once per run, and its settling once more; one no
        sink takes is forgotten once settled (a sink's are by the notices' own rules)."""
        for subject, alert in list(self.state.alerts.items()):
            if alert.kind != "goal":
                continue
            settled = _goal_settled(alert, projection)
            if subject not in self._logged and settled is None:
                self._logged.add(subject)
                facts = alert.facts
                log.warning("goal: thread %s's Codex goal reached %s (%s of %s tokens used): Codex starts no more"
                            " turns for it; a person decides what follows", alert.thread_id, alert.step,
                            facts.get("tokens_used"), facts.get("token_budget"))
            elif subject in self._logged and settled is not None:
                self._logged.discard(subject)
                log.info("resolved: thread %s's goal is no longer %s (%s)", alert.thread_id, alert.step, settled)
            if settled is not None and not any(alert.kind in sink.kinds for sink in self.sinks):
                del self.state.alerts[subject]

    # -- the snapshot ----------------------------------------------------------------

    def load(self, recorder: Recorder) -> None:
        """The fold as of the ledger's end: the saved snapshot, then the rows after it.
        Without a sink, only the resolutions (the overdue count leaves them out): the
        kind index finds them."""
        if not self.sinks:
            self.state.resolved = resolutions(recorder.history(kinds=(RESOLUTION_KIND,)))
            return
        saved = recorder.load_snapshot(SNAPSHOT_NAME)
        if saved is not None and saved[0] <= recorder.max_seq():
            try:
                self.state = _decoder.decode(saved[1])
            except msgspec.DecodeError:
                self.state = _State()  # an unreadable snapshot only costs a full re-read
        for entry in recorder.read(after_seq=self.state.seq):
            self.fold(entry)

    def drop_settled(self, projection: Projection) -> None:
        """At a start: forget subjects that opened and settled while no daemon ran and
        that no sink was ever told of, so a sink added to an old ledger is not sent its
        history."""
        told = {key.rpartition("@")[0] for sent in self.state.sent.values() for key in sent}
        for subject, alert in list(self.state.alerts.items()):
            if subject not in told and self._settled(alert, projection, subject) is not None:
                del self.state.alerts[subject]

    def save(self, recorder: Recorder) -> None:
        if self.sinks:
            recorder.save_snapshot(SNAPSHOT_NAME, self.state.seq, _encoder.encode(self.state))


def thread_link(dashboard_url: str, thread_id: str) -> str:
    """The thread's page on the dashboard (its route ``/thread/{id}`` under the address
    the dashboard prints, its ``/d/PREFIX/`` path included); the id quoted, as it is the
    agent's to choose."""
    return f"{dashboard_url.rstrip('/')}/thread/{quote(thread_id, safe='')}"


def _covered(intent, step: str, resolution: Resolution | None) -> bool:
    """Whether ``resolution`` covers the overdue notice's step: the deadline it names had
    passed when the person resolved it."""
    due_at = intent.ack_deadline if step == "ack" else intent.effect_deadline
    return resolution is not None and due_at is not None and resolution_covers(resolution.at, due_at)


def _goal_settled(alert: Alert, projection: Projection) -> str | None:
    """How a goal subject settled: its thread's goal moved to another status ("goal_"
    and that status), or it was never the change the fold knows (a late copy of a report
    whose change came before); None while the goal stands as the subject says."""
    thread = projection.threads.get(alert.thread_id)
    goal = thread.goal if thread is not None else None
    if goal is None:
        return "goal_unknown"
    if goal.status != alert.step:
        return f"goal_{goal.status}"
    return None if goal.changed_at == alert.facts.get("changed_at") else "goal_changed_before"


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_State)
