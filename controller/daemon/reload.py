"""Reloading the rule and config files while the daemon runs.

Sans-IO except for reading the two files: ``RuleReloader.poll`` looks at the files'
(mtime, size, inode), and when either changed (or when asked to, on SIGHUP) loads
them again and returns what to record and whether the running set changes:

* valid: a ``ruleset_loaded`` event with the new digest (and the one it replaces) and
  the set itself (``ruleset_text``: ``tillerman replay --check`` rebuilds it from there);
  the daemon swaps the set into its Step and its adapter, and the patterns into its
  tap. A change that leaves the digests as they were (a comment, a reordering)
  records nothing.
* invalid: a ``ruleset_rejected`` event with the line-accurate error and the digest
  that keeps deciding; the running set stays. The same broken content is rejected
  once, not on every poll. Every kind of bad file is one: invalid, too deep, too
  large, not a regular file (a FIFO, ``/dev/zero``), or one someone else could have
  written (``tillerman.rules.file_safety.read_file``: the daemon runs a rule's ``verify`` as you).

Without ``--config`` the default config file (``tillerman.rules.config.config_file``) is the
one watched, whether it exists or not: creating it applies it, removing it goes
back to running with no config file (the owner's built-in grant, built-in patterns).

Polling (``POLL_EVERY`` seconds) rather than inotify: two stats a second cost
nothing, work on every filesystem, and see an editor's rename-over-save the same as
an in-place write.

Each poll also reports rules past ``review_by`` or ``expires`` (``tillerman.rules.lifecycle.
reviews``): a ``report`` event per rule, with a deterministic id and time (the due
date), so a restart or a reload offers the same fact again and the ledger keeps one.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import msgspec

from tillerman.controller.core.intent_requests import SOURCE
from tillerman.ledger.events import Envelope, Report, RulesetLoaded, RulesetRejected
from tillerman.rules.config import Effective, config_file, default_config_path, load_effective
from tillerman.rules.errors import RuleSetError
from tillerman.rules.lifecycle import reviews
from tillerman.rules.ruleset import ruleset_text

log = logging.getLogger("tillerman")

POLL_EVERY = 1.0

Signature = tuple[tuple[int, ...] | None, ...]


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    envelopes: list[Envelope]
    effective: Effective | None = None  # the new set to run with; None: keep the running one


class RuleReloader:
    def __init__(self, rules_path: str | Path | None, config_path: str | Path | None, effective: Effective) -> None:
        """``config_path`` is ``--config`` as given; None means the default file."""
        self.rules_path = Path(rules_path) if rules_path else None
        self._config_given = Path(config_path) if config_path else None
        self._config_watched = self._config_given or default_config_path()
        self.config_path = config_file(self._config_given)  # the file in use (None: no file)
        self.effective = effective
        self._signature: Signature | None = None  # None: nothing recorded yet (the start)
        self._reviewed: set[tuple[str, int, str]] = set()

    def poll(self, now: float, *, forced: bool = False) -> Outcome:
        """What to record now: the start, a reload, a rejection, overdue reviews."""
        envelopes: list[Envelope] = []
        new: Effective | None = None
        signature = self._stat()
        if self._signature is None:
            self._signature = signature
            envelopes.append(self._loaded(self.effective, None, "start", now))
        elif forced or signature != self._signature:
            self._signature = signature
            reason = "sighup" if forced else "reload"
            self.config_path = config_file(self._config_given)
            try:
                candidate = load_effective(self.rules_path, self.config_path)
            except RuleSetError as exc:
                log.error("rule reload rejected (%s); still deciding with %s:\n%s",
                          reason, self.effective.ruleset.digest, exc)
                envelopes.append(self._rejected(str(exc), reason, now))
            except Exception as exc:  # a loader bug must not take the running set (or the daemon) down with it
                log.exception("rule reload failed (%s); still deciding with %s", reason, self.effective.ruleset.digest)
                envelopes.append(self._rejected(f"the files could not be loaded ({type(exc).__name__}: {exc}); "
                                                "check them with tillerman rules validate", reason, now))
            else:
                if (candidate.ruleset.digest, candidate.patterns_digest) != (
                        self.effective.ruleset.digest, self.effective.patterns_digest):
                    log.warning("rules reloaded (%s): %s -> %s", reason, self.effective.ruleset.digest,
                                candidate.ruleset.digest)
                    envelopes.append(self._loaded(candidate, self.effective.ruleset.digest, reason, now))
                    self.effective = new = candidate
        envelopes.extend(self._reviews(now))
        return Outcome(envelopes=envelopes, effective=new)

    # -- records ------------------------------------------------------------------

    def _loaded(self, effective: Effective, previous: str | None, reason: str, now: float) -> Envelope:
        event = RulesetLoaded(
            digest=effective.ruleset.digest, previous_digest=previous, reason=reason,
            rules_path=str(self.rules_path) if self.rules_path else None,
            config_path=str(self.config_path) if self.config_path else None,
            rules=len(effective.ruleset.rules), patterns_digest=effective.patterns_digest,
            ruleset_text=ruleset_text(effective.ruleset),
        )
        return Envelope(event_id=f"ruleset_loaded:{uuid.uuid4().hex}", event=event, source=SOURCE, at=now)

    def _rejected(self, error: str, reason: str, now: float) -> Envelope:
        event = RulesetRejected(
            error=error, kept_digest=self.effective.ruleset.digest, reason=reason,
            rules_path=str(self.rules_path) if self.rules_path else None,
            config_path=str(self.config_path) if self.config_path else None,
        )
        return Envelope(event_id=f"ruleset_rejected:{uuid.uuid4().hex}", event=event, source=SOURCE, at=now)

    def _reviews(self, now: float) -> list[Envelope]:
        out = []
        for review in reviews(self.effective.ruleset, now):
            key = (review.rule_id, review.rule_version, review.why)
            if key in self._reviewed:
                continue
            self._reviewed.add(key)
            log.warning("%s", review.message)
            event = Report(rule_id=review.rule_id, rule_version=review.rule_version, finding=review.message,
                           detail={"why": review.why, "due": review.due, "kind": "rule_review"})
            out.append(Envelope(event_id=f"rule_review:{review.rule_id}:v{review.rule_version}:{review.why}",
                                event=event, source=SOURCE, at=review.due_at))
        return out

    def _stat(self) -> Signature:
        return tuple(_stat(path) for path in (self.rules_path, self._config_watched))


def _stat(path: Path | None) -> tuple[int, ...] | None:
    """What a change of the file changes: its content (mtime, size), its identity
    (inode, device: a rename over it, a symlink to elsewhere) and who may write it
    (mode, owner: a chmod o+w makes it one the daemon refuses)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (0,)  # gone: loading it reports why
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev, st.st_mode, st.st_uid)
