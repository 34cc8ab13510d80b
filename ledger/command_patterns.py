"""Which commands are critical or cross the machine boundary: the meaning of the
``critical`` and ``external`` flags that item events carry (``ItemStarted``).

The rules package reads configured patterns from the config file
(``tillerman.rules.config``) and the controller hands them to the monitor as data;
both import them from here, the package below them. ``DEFAULT`` is used when none
are configured. A command is
classified once, at ingestion, and only the two booleans are stored: the command
text itself never reaches the ledger.

critical: an effect that is expensive or impossible to undo (a deploy, a
migration, a push, a package publication, infrastructure changes, a payment, a
dropped database). Interrupting while one runs can leave things half-done.

external: the effect leaves this machine (pushes, publications, deploys, HTTP
requests that change remote state, payments). An external item that started and
never completed is an *unknown external effect* for the controller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

_PUBLISH = r"\b(?:npm|pnpm|yarn)\s+publish\b|\btwine\s+upload\b|\b(?:cargo|poetry|uv|flit|hatch)\s+publish\b|\bgem\s+push\b"
_PUSH = r"\bgit\s+push\b|\b(?:docker|podman)\s+push\b"
_DEPLOY = r"\bdeploy\b"  # fly deploy, vercel deploy, make deploy, ./deploy.sh, kubectl rollout … deploy
_INFRA = r"\bterraform\s+(?:apply|destroy)\b|\bkubectl\s+(?:apply|delete|replace)\b|\bhelm\s+(?:install|upgrade|uninstall|rollback)\b"
_PAYMENT = r"api\.stripe\.com|\bstripe\s+(?:charges|payment_intents|payouts|refunds|transfers)\b"
_MIGRATION = r"\bmigrate\b|\balembic\s+(?:upgrade|downgrade)\b|\bflyway\b"
_DB_DROP = r"\bdrop\s+(?:database|schema|table)\b|\bdropdb\b|\btruncate\s+table\b"
_HTTP_WRITE = (
    r"\bcurl\b.*(?:-X\s*|--request[\s=]+)(?:POST|PUT|PATCH|DELETE)\b"
    r"|\bcurl\b.*\s(?:-d|--data(?:-\w+)?|-F|--form)\b"
    r"|\bwget\b.*--post-"
    r"|\bhttp\s+(?:POST|PUT|PATCH|DELETE)\b"
)
_REMOTE = r"\b(?:scp|rsync)\b.*\S+:|\bgh\s+(?:pr|release|issue)\s+(?:create|merge|edit|close|comment)\b"


@dataclass(frozen=True)
class CommandPatterns:
    """Regular expressions (case-insensitive, searched anywhere in the command)."""

    critical: tuple[str, ...]
    external: tuple[str, ...]

    @cached_property
    def _critical_re(self) -> re.Pattern[str] | None:
        return _compile(self.critical)

    @cached_property
    def _external_re(self) -> re.Pattern[str] | None:
        return _compile(self.external)

    @cached_property
    def _classified(self) -> dict[str, tuple[bool, bool]]:
        return {}

    def classify(self, command_text: str) -> tuple[bool, bool]:
        """``(critical, external)`` for one command line."""
        # Agents run the same commands again and again (tests, builds, retries): each
        # distinct line is searched once, up to a bound.
        classified = self._classified
        flags = classified.get(command_text)
        if flags is None:
            crit = self._critical_re
            ext = self._external_re
            flags = (bool(crit and crit.search(command_text)), bool(ext and ext.search(command_text)))
            if len(classified) >= _REMEMBERED:
                classified.clear()
            classified[command_text] = flags
        return flags


_REMEMBERED = 4096


def _compile(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


DEFAULT = CommandPatterns(
    critical=(_DEPLOY, _MIGRATION, _PUSH, _PUBLISH, _INFRA, _PAYMENT, _DB_DROP),
    external=(_PUSH, _PUBLISH, _DEPLOY, _INFRA, _HTTP_WRITE, _PAYMENT, _REMOTE),
)


def classify(command_text: str, patterns: CommandPatterns = DEFAULT) -> tuple[bool, bool]:
    return patterns.classify(command_text)
