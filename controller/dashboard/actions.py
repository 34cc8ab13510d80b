"""The dashboard's forms as the CLI's calls: steer, queue, interrupt, stop, cancel an
intent, resolve an overdue notice, label.

Each action calls the library function its CLI command calls, with the CLI's defaults
(those of ``tillerman.controller.core.intent_requests``: the deadlines are not restated
here), so the page records exactly what ``tillerman intent propose`` would. Grants and
holds are the daemon's to apply when it picks the intent up, as for the CLI: a refusal
there shows in the intent's state journey. A refusal at proposal — a bad form, an
unknown intent, a move the state table does not allow — is an ``ActionResult`` with
``ok=False`` and the error's one line, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from tillerman.controller.core import intent_requests, labeling, notice_resolution
from tillerman.controller.core.printable import printable
from tillerman.ledger.errors import IllegalTransition, UnknownIntent
from tillerman.ledger.labels import subject_of
from tillerman.ledger.recorder import Recorder

ACTIONS: tuple[str, ...] = ("steer", "queue", "interrupt", "stop", "cancel", "resolve", "label")

#: The largest field a form may carry. The CLI has no limit of its own (a shell bounds
#: its arguments); a page is reachable by any request, and a message this long is no
#: steer a person typed.
TEXT_LIMIT = 16_384
#: Ids, turn ids, verdicts: one short line each.
NAME_LIMIT = 256


class ActionResult(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str  # one line: what happened, or the refusal and what to do
    intent_id: str | None = None
    subject: str | None = None


class _Refused(ValueError):
    """A form the action cannot take, with what to do instead."""


def perform(recorder: Recorder, action: str, form: Mapping[str, str], *, owner: str, now: float) -> ActionResult:
    """Carry out one of ``ACTIONS`` for ``owner``; never raises for bad input."""
    handler = _HANDLERS.get(action)
    if handler is None:
        return ActionResult(ok=False, message=f"unknown action {printable(str(action))!r}; one of {', '.join(ACTIONS)}")
    try:
        return handler(recorder, form, owner, now)
    except (ValueError, UnknownIntent, IllegalTransition) as exc:  # IntentError, LostRace, NoticeError are ValueErrors
        return ActionResult(ok=False, message=_one_line(str(exc)))


def _field(form: Mapping[str, str], name: str, *, required: bool = True, limit: int = NAME_LIMIT) -> str | None:
    value = form.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise _Refused(f"the form has no {name}; fill it in")
        return None
    if not isinstance(value, str):
        raise _Refused(f"the form's {name} is not text")
    if len(value) > limit:
        raise _Refused(f"the form's {name} is {len(value)} characters long; at most {limit}")
    return value


def _proposal(mode: str) -> Callable[[Recorder, Mapping[str, str], str, float], ActionResult]:
    def propose(recorder: Recorder, form: Mapping[str, str], owner: str, now: float) -> ActionResult:
        request = {"thread_id": _field(form, "thread"), "mode": mode,
                   "text": _field(form, "text", limit=TEXT_LIMIT), "owner": owner}
        if mode in ("steer", "interrupt"):  # the page acts on the running turn unless it names one
            request["expected_turn"] = _field(form, "expected_turn", required=False) or "active"
        intent = intent_requests.propose(recorder, now=now, **request)
        return ActionResult(ok=True, message=f"proposed {mode} {intent.id} on thread {intent.thread_id}",
                            intent_id=intent.id, subject=subject_of("intent", intent.id))
    return propose


def _cancel(recorder: Recorder, form: Mapping[str, str], owner: str, now: float) -> ActionResult:
    intent_id = _field(form, "intent")
    intent_requests.cancel(recorder, intent_id, now=now)
    return ActionResult(ok=True, message=f"cancelled {intent_id}", intent_id=intent_id, subject=subject_of("intent", intent_id))


def _resolve(recorder: Recorder, form: Mapping[str, str], owner: str, now: float) -> ActionResult:
    subject = _field(form, "subject")
    intent_id = notice_resolution.intent_of(subject)
    resolution = notice_resolution.resolve(recorder, intent_id, by=owner, now=now,
                                           note=_field(form, "note", required=False, limit=TEXT_LIMIT))
    return ActionResult(ok=True, message=f"resolved {resolution.subject}", intent_id=intent_id,
                        subject=resolution.subject)


def _label(recorder: Recorder, form: Mapping[str, str], owner: str, now: float) -> ActionResult:
    subject, verdict = _field(form, "subject"), _field(form, "verdict")
    labeling.label(recorder, subject, verdict, note=_field(form, "note", required=False, limit=TEXT_LIMIT), by=owner)
    return ActionResult(ok=True, message=f"labeled {subject} {verdict}", subject=subject)


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "refused"


_HANDLERS: dict[str, Callable[[Recorder, Mapping[str, str], str, float], ActionResult]] = {
    **{mode: _proposal(mode) for mode in ("steer", "queue", "interrupt", "stop")},
    "cancel": _cancel, "resolve": _resolve, "label": _label,
}
