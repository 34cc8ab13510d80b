"""A person resolving an overdue notice: "I have seen it; stop telling me."

``NoticeResolved`` (subject ``overdue:INTENT``) is recorded by ``tillerman overdue
resolve`` and the dashboard; the intent itself is untouched (cancel it, or let it
settle, to change that). A resolution covers every deadline the intent had missed when
it was made: ``tillerman overdue`` no longer lists the intent and its ``--check``
passes, and the notifier sends its sinks the ``resolved`` step once and repeats it no
more. A deadline missed after it (acknowledged, then the effect deadline passes) is a
new notice.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tillerman.controller.core.intent_requests import SOURCE, intent_view
from tillerman.controller.core.overdue import OVERDUE_SUBJECT, deadline, overdue_subject, resolution_covers
from tillerman.controller.core.printable import printable
from tillerman.controller.core.timefmt import iso
from tillerman.ledger.events import Entry, Envelope, NoticeResolved
from tillerman.ledger.recorder import Recorder

KIND = "notice_resolved"


class NoticeError(ValueError):
    """A notice that cannot be resolved, with why."""


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    by: str
    at: float
    note: str | None = None


def intent_of(subject: str) -> str:
    """The intent an ``overdue:INTENT`` subject names; ``NoticeError`` for any other."""
    prefix, _, intent_id = subject.partition(":")
    if f"{prefix}:" != OVERDUE_SUBJECT or not intent_id:
        raise NoticeError(f"only an overdue notice can be resolved: give overdue:INTENT, not {printable(subject)!r}")
    return intent_id


def resolutions(entries: Iterable[Entry]) -> dict[str, Resolution]:
    """The latest resolution of each subject, from ledger rows (pure)."""
    found: dict[str, Resolution] = {}
    for entry in entries:
        event, at = entry.envelope.event, entry.envelope.at
        if isinstance(event, NoticeResolved) and at is not None:
            found[event.subject] = Resolution(subject=event.subject, by=event.by, at=at, note=event.note)
    return found


def read_resolutions(recorder: Recorder) -> dict[str, Resolution]:
    """The ledger's resolutions (the kind index finds them: a few rows in any ledger)."""
    return resolutions(recorder.history(kinds=(KIND,)))


def resolve(recorder: Recorder, intent_id: str, *, by: str, now: float, note: str | None = None) -> Resolution:
    """Record that ``by`` resolved the overdue notice of ``intent_id``. ``UnknownIntent``
    for no such intent; ``NoticeError`` when it is not overdue now, or already resolved."""
    view = intent_view(recorder, intent_id)
    due = deadline(view)
    if due is None:
        raise NoticeError(f"intent {intent_id} is {view.state} and waits on no deadline: no overdue notice to resolve")
    step, due_at = due
    if now < due_at:
        raise NoticeError(f"intent {intent_id} is not overdue: its {step} deadline is {iso(due_at)}")
    subject = overdue_subject(intent_id)
    earlier = read_resolutions(recorder).get(subject)
    if earlier is not None and resolution_covers(earlier.at, due_at):
        raise NoticeError(f"the overdue notice of intent {intent_id} was resolved by {earlier.by}"
                          f" at {iso(earlier.at)} already")
    resolution = Resolution(subject=subject, by=by, at=now, note=note)
    event = NoticeResolved(subject=subject, by=by, note=note, thread=view.intent.thread_id)
    # One resolution per missed deadline: its id says which, so a second writer's copy is the same row.
    recorder.append([Envelope(event_id=f"{subject}@{step}:resolved", event=event, source=SOURCE, at=now)],
                    durable=True)
    return resolution
