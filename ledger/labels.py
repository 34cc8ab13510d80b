"""The owner's labels, folded: the verdict that stands on each subject, and every verdict
given on it.

A label (``OwnerLabeled``) is the owner's judgment of something tillerman did or said:
an intervention (``intent:ID``), a rule's finding (``finding:EVENT_ID``, the id of its
``report`` event) or a reviewer's answer (``review:CHECKPOINT_ID``). They are what rules
and reviewers are measured against; they grant nothing. A later label of a subject
replaces the earlier one in the account (``Labels.current``); both stay on record
(``Labels.history``).

A reviewer's disposition is compared with the owner's label of the intent it was about:
a disposition that lets the intervention go on (``ENDORSING``) says the reviewer found
it useful; any other (hold, return to the executor, escalate, missing evidence) says it
did not. ``reviewer_agrees`` is that comparison, the one the report and ``review try
--labeled`` both make.

Pure: ``Labels.apply`` folds one entry at a time, like ``tillerman.ledger.projections``.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tillerman.ledger.events import Entry, OwnerLabeled

VERDICTS: tuple[str, ...] = ("useful", "not_useful", "harmful")
SUBJECT_KINDS: tuple[str, ...] = ("intent", "finding", "review")
#: Dispositions that let the intervention go on: the reviewer judged it useful.
ENDORSING = frozenset({"ready_for_existing_gate", "continue_with_directive"})
#: How an intent id begins (``tillerman.ledger.intents.intent_id_from``): a bare one is an intent subject.
INTENT_PREFIX = "in-"


def subject_of(kind: str, id_: str) -> str:
    """The subject naming ``id_`` of ``kind`` (one of ``SUBJECT_KINDS``)."""
    if kind not in SUBJECT_KINDS:
        raise ValueError(f"a label's subject is one of {', '.join(SUBJECT_KINDS)}, not {kind!r}")
    if not id_:
        raise ValueError(f"a {kind} subject needs an id")
    return f"{kind}:{id_}"


def parse_subject(subject: str) -> tuple[str, str]:
    """``(kind, id)`` of a subject; a bare intent id (``in-…``) is ``intent:in-…``.
    ``ValueError`` says what to give instead."""
    if subject.startswith(INTENT_PREFIX):
        return "intent", subject
    kind, colon, id_ = subject.partition(":")
    if not colon or kind not in SUBJECT_KINDS or not id_:
        raise ValueError(f"subject {subject!r} names nothing to label; give intent:ID (or a bare in-… id),"
                         " finding:EVENT_ID (a rule's report event) or review:CHECKPOINT_ID")
    return kind, id_


def reviewer_agrees(disposition: str, verdict: str) -> bool:
    """Whether a reviewer's disposition on an intent says what the owner's verdict on it says."""
    return (disposition in ENDORSING) == (verdict == "useful")


class Label(msgspec.Struct, frozen=True, kw_only=True):
    subject: str
    verdict: str
    note: str | None
    by: str
    at: float | None
    seq: int
    event_id: str
    thread: str | None = None


class Labels:
    def __init__(self) -> None:
        self._history: dict[str, list[Label]] = {}

    def apply(self, entry: Entry) -> None:
        env = entry.envelope
        event = env.event
        if not isinstance(event, OwnerLabeled):
            return
        self._history.setdefault(event.subject, []).append(Label(
            subject=event.subject, verdict=event.verdict, note=event.note, by=event.by, at=env.at, seq=entry.seq,
            event_id=env.event_id, thread=event.thread))

    def fold(self, entries: Iterable[Entry]) -> Labels:
        for entry in entries:
            self.apply(entry)
        return self

    def current(self, subject: str) -> Label | None:
        """The label that stands: the latest given (in ledger order)."""
        given = self._history.get(subject)
        return given[-1] if given else None

    def history(self, subject: str) -> list[Label]:
        """Every label given on ``subject``, oldest first."""
        return list(self._history.get(subject, ()))

    def all_current(self) -> list[Label]:
        """The label standing on each labeled subject, in the order they were last labeled."""
        return sorted((given[-1] for given in self._history.values()), key=lambda label: label.seq)

    def __len__(self) -> int:
        return len(self._history)


def fold_labels(entries: Iterable[Entry]) -> Labels:
    return Labels().fold(entries)
