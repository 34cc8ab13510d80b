"""Labeling: the owner's verdict on an intervention, a rule's finding or a reviewer's
answer, recorded as one chained ledger event (``OwnerLabeled``; the fold is
``tillerman.ledger.labels``).

The library behind ``tillerman label`` and the dashboard's one click: both call
``label``. The subject must be on record, so a typo is refused rather than labeling
nothing forever. Storage is raw: a note is kept as written; whoever shows it escapes it.
A label is evidence about a rule or a reviewer, never a permission: nothing that decides
what tillerman may do reads it.
"""

from __future__ import annotations

import os
import time

from tillerman.controller.core.intent_requests import SOURCE, intent_view
from tillerman.controller.core.printable import printable
from tillerman.controller.core.timefmt import check_time
from tillerman.ledger.errors import UnknownIntent
from tillerman.ledger.events import Envelope, OwnerLabeled
from tillerman.ledger.labels import VERDICTS, parse_subject, subject_of
from tillerman.ledger.recorder import Recorder


class LabelError(ValueError):
    """A label that cannot be recorded, with what to give instead."""


def label(recorder: Recorder, subject: str, verdict: str, *, note: str | None = None, by: str,
          now: float | None = None) -> OwnerLabeled:
    """Record the owner's ``verdict`` on ``subject`` (``intent:ID`` or a bare ``in-…``,
    ``finding:EVENT_ID``, ``review:CHECKPOINT_ID``) and return the event written."""
    now = time.time() if now is None else now
    if verdict not in VERDICTS:
        raise LabelError(f"verdict must be one of {', '.join(VERDICTS)}, not {printable(verdict)!r}")
    if not isinstance(by, str) or not by.strip():
        raise LabelError("--by is empty; say who labels (default: the local login name)")
    if note is not None and not note.strip():
        raise LabelError("--note is empty; give a note or leave the option out")
    try:
        check_time(now, "the time of the label")
        kind, id_ = parse_subject(subject)
    except ValueError as exc:
        raise LabelError(str(exc)) from None
    thread = thread_of(recorder, kind, id_)
    event = OwnerLabeled(subject=subject_of(kind, id_), verdict=verdict, note=note, by=by, thread=thread)
    # A label is one act of a person: its id is new each time, so a second label of the
    # same subject is a second record (the later one stands), never a conflict.
    envelope = Envelope(event_id=f"label:{event.subject}:{os.urandom(8).hex()}", event=event, source=SOURCE, at=now)
    recorder.append([envelope], durable=True)
    return event


def thread_of(recorder: Recorder, kind: str, id_: str) -> str | None:
    """The thread of the subject on record; ``LabelError`` when the ledger has no such subject."""
    if kind == "intent":
        try:
            return intent_view(recorder, id_).intent.thread_id
        except UnknownIntent as exc:
            raise LabelError(str(exc)) from None
    if kind == "finding":
        for entry in recorder.history(kinds=("report",)):
            if entry.envelope.event_id == id_:
                return entry.envelope.event.thread_id
        raise LabelError(f"no finding {printable(id_)} in this ledger; give the event id of a rule's report"
                         " (the event_id column of `tillerman report --db FILE`'s notifications table)")
    for entry in recorder.history(kinds=("review_committed",)):
        if entry.envelope.event.checkpoint_id == id_:
            return entry.envelope.event.thread_id
    raise LabelError(f"no reviewer answer {printable(id_)} in this ledger; give the checkpoint id of a"
                     " review_committed record")
