"""The rule set the policy and the detection rules see: frozen msgspec values.

Rule and config files are validated by pydantic in ``tillerman.rules.schema``; what comes out
is a ``RuleSet`` of these structs, so ``decide()`` and ``detect()`` never touch a
pydantic object and a rule set can be hashed, compared and recorded as is.

Authority lives in ``Grant``s, apart from the rules: a rule names the action it
wants, and only a grant for its subject (``rule:ID``) lets that action be carried
out. A rule cannot grant itself anything.
"""

from __future__ import annotations

import calendar
import datetime
import hashlib
from collections.abc import Iterable
from typing import Any, Literal, get_args

import msgspec

from tillerman.rules.decision import Action
from tillerman.rules.prices import PriceOverride

RuleStatus = Literal["proposed", "shadow", "active", "retired"]
RULE_STATUSES: tuple[str, ...] = get_args(RuleStatus)

#: What a grant may allow: the dispatch actions, plus ``interrupt_critical``, which
#: lets a forced interrupt (or stop) through while a critical tool runs (it is checked
#: in addition to ``interrupt`` or ``stop``, never instead of it). ``stop`` is its own
#: grant: ``interrupt`` ends one turn, a stop also pauses the thread's goal.
GrantableAction = Literal["steer", "queue", "interrupt", "interrupt_critical", "stop"]
GRANTABLE_ACTIONS: tuple[str, ...] = get_args(GrantableAction)
INTERRUPT_CRITICAL = "interrupt_critical"

#: ``threads`` value (and grant ``subject``) matching everything.
ANY = "*"


def matches_thread(threads: str | tuple[str, ...], thread_id: str) -> bool:
    """``"*"``, one thread id, or a tuple of ids. Exact ids only: a glob that
    silently widens an authority grant is worse than a longer list."""
    if isinstance(threads, str):
        return threads in (ANY, thread_id)
    return ANY in threads or thread_id in threads


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """``subject`` may request ``actions`` on ``threads``.

    subject: ``owner:NAME``, ``rule:ID``, ``reviewer:NAME`` or ``*`` (anyone).
    builtin: the local owner's default grant (``tillerman.rules.owner``), not one from a file;
    it allows the same as any grant, and ``rules show`` says where it came from.
    """

    subject: str
    actions: frozenset[str]
    threads: str | tuple[str, ...] = ANY
    builtin: bool = False

    def allows(self, subject: str, action: str, thread_id: str) -> bool:
        return (
            self.subject in (ANY, subject)
            and action in self.actions
            and matches_thread(self.threads, thread_id)
        )


# -- conditions: a closed set of named observations with parameters ----------------


class Condition(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the condition kinds; the tag is the kind's name in rule files."""


class TurnQuiet(Condition, tag="turn_quiet"):
    """The active turn made no progress for ``for_seconds`` (not during a critical
    tool or a pending approval: a quiet build is healthy)."""

    for_seconds: float


class RepeatedFailure(Condition, tag="repeated_failure"):
    """The same command (same arguments digest) failed ``count`` times."""

    count: int
    within: Literal["turn"] = "turn"


class ApprovalWaiting(Condition, tag="approval_waiting"):
    for_seconds: float


class CriticalToolRunning(Condition, tag="critical_tool_running"):
    for_seconds: float


class IntentOverdue(Condition, tag="intent_overdue"):
    """Owned intents past a deadline: found by ``decide()`` (``report_overdue``);
    the rule carries who owns the report and until when it is reviewed."""


class TurnLong(Condition, tag="turn_long"):
    for_seconds: float


class GoalBudgetLimited(Condition, tag="goal_budget_limited"):
    """The thread's Codex goal reached ``budgetLimited``: its token budget is spent and
    Codex starts no more turns for it. Once per such change of the goal."""


BudgetMeasure = Literal["tokens", "cost_usd", "context"]
BudgetScope = Literal["turn", "thread", "goal", "day", "owner"]


class Budget(Condition, tag="budget"):
    """What a scope spent reached ``over``: its tokens (input + output), its cost in USD
    (the rule set's price table), or the context its last response used (last input
    over the context window, 0..1). ``per``: the running turn, the thread, the thread's
    goal while it has one, the thread's UTC day, or the owner's UTC day (every
    supervised thread together). Once per crossing: per scope instance and limit
    (``tillerman.rules.budget``)."""

    measure: BudgetMeasure
    over: float
    per: BudgetScope = "thread"


AnyCondition = (TurnQuiet | RepeatedFailure | ApprovalWaiting | CriticalToolRunning | IntentOverdue | TurnLong
                | GoalBudgetLimited | Budget)
CONDITION_KINDS: tuple[str, ...] = tuple(c.__struct_config__.tag for c in get_args(AnyCondition))


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    version: int
    status: RuleStatus
    condition: AnyCondition
    action: Action
    owner: str
    review_by: datetime.date
    text: str | None = None  # template: "{count}", "{tool}", … (see tillerman.rules.detect)
    ack_deadline: float | None = None  # seconds after the finding
    verify: str | None = None  # readback command proving the steer's effect (intent --verify)
    expires: datetime.date | None = None  # from 00:00 UTC that day the rule is out of force
    threads: str | tuple[str, ...] = ANY
    review: str | None = None  # the [[reviewer]] asked before an intent of this rule is dispatched
    # the label its intents carry (``Intent.task_class``); UNSET keeps the rule set's digest
    task_class: str | msgspec.UnsetType = msgspec.UNSET

    def in_force(self, now: float) -> bool:
        """Not past ``expires``. (Status is the caller's question: shadow rules are
        in force for detection but never for dispatch.)"""
        ends = self.out_of_force_at()
        return ends is None or now < ends

    def out_of_force_at(self) -> float | None:
        """The moment ``expires`` takes the rule out of force (00:00 UTC that day); None: never."""
        return None if self.expires is None else calendar.timegm(self.expires.timetuple())


class RuleSet(msgspec.Struct, frozen=True, kw_only=True):
    rules: tuple[Rule, ...]
    grants: tuple[Grant, ...]
    digest: str  # sha256 of the canonical encoding of rules and grants
    # The price table cost budgets read (``tillerman.rules.budget.Prices``); None: no
    # cost is known, and a cost budget never fires. Not in the digest: its date is
    # recorded with every finding that read it.
    prices: Any = None
    # The config's ``[prices."MODEL"]`` overrides on that table, recorded with the rule
    # set (``ruleset_text``) so replay prices as the daemon did.
    price_overrides: dict[str, PriceOverride] = {}

    def allows(self, subject: str, action: str, thread_id: str) -> bool:
        return any(g.allows(subject, action, thread_id) for g in self.grants)

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def ruleset_digest(rules: Iterable[Rule], grants: Iterable[Grant],
                   price_overrides: dict[str, PriceOverride] | None = None) -> str:
    """Order-insensitive: rules sorted by id, grants and their action sets sorted, so
    reformatting or reordering a file keeps the digest and any change of meaning
    changes it. The config's price overrides change what a cost budget reads, so they
    are in it too, when there are any (a rule set without keeps its digest)."""
    canonical = {
        "rules": sorted((rule_builtins(r) for r in rules), key=lambda r: r["id"]),
        "grants": sorted(
            (_canonical_grant(g) for g in grants),
            key=lambda g: msgspec.json.encode(g, order="sorted"),
        ),
    }
    if price_overrides:
        canonical["prices"] = msgspec.to_builtins(price_overrides)
    return "sha256:" + hashlib.sha256(msgspec.json.encode(canonical, order="sorted")).hexdigest()


def rule_builtins(rule: Rule) -> dict:
    """A rule as digests see it: without ``review`` when it is unset, so a rule written
    before reviewers existed keeps its digest and setting one changes it."""
    data = msgspec.to_builtins(rule)
    if data.get("review") is None:
        data.pop("review", None)
    return data


def _canonical_grant(grant: Grant) -> dict:
    """A file grant encodes as it did before built-in grants existed (its digest stays);
    the built-in one says so, so an identical file grant beside it still counts."""
    data = msgspec.to_builtins(grant) | {"actions": sorted(grant.actions)}
    if not grant.builtin:
        del data["builtin"]
    return data


def build_ruleset(rules: Iterable[Rule], grants: Iterable[Grant], prices: Any = None,
                  price_overrides: dict[str, PriceOverride] | None = None) -> RuleSet:
    rules, grants = tuple(rules), tuple(grants)
    overrides = price_overrides or {}
    return RuleSet(rules=rules, grants=grants, digest=ruleset_digest(rules, grants, overrides), prices=prices,
                   price_overrides=overrides)


class _Recorded(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    rules: tuple[Rule, ...]
    grants: tuple[Grant, ...]
    prices: dict[str, PriceOverride] = {}  # left out when there are none: older texts stay the same


def ruleset_text(ruleset: RuleSet) -> str:
    """The rule set as a ledger records it (``ruleset_loaded``): JSON of its rules and
    grants, the validated values rather than the files they came from, so rebuilding it
    needs neither the files, nor the login the owner's built-in grant names, nor the
    built-in rules of the tillerman that reads it (``ruleset_from_text``), and the
    config's price overrides, so cost is priced the same."""
    recorded = _Recorded(rules=ruleset.rules, grants=ruleset.grants, prices=ruleset.price_overrides)
    return msgspec.json.encode(recorded, order="deterministic").decode()


def ruleset_from_text(text: str) -> RuleSet:
    """The rule set ``ruleset_text`` wrote, its digest computed again. Raises
    ``msgspec.DecodeError`` (``ValidationError`` included) for text this version cannot read,
    ``PriceFileError`` when its budgets need the price table and the imported one is spoiled."""
    recorded = msgspec.json.decode(text, type=_Recorded)
    return build_ruleset(recorded.rules, recorded.grants, prices_for(recorded.rules, recorded.prices),
                         recorded.prices)


def prices_for(rules: Iterable[Rule], overrides: dict[str, PriceOverride] | None = None) -> Any:
    """The price table a rule set's budgets read (``tillerman.rules.prices.load_prices``,
    with the config's overrides), loaded only when a budget measures cost or context (a
    model's window); None otherwise. Raises ``PriceFileError`` for a spoiled imported table."""
    if not any(isinstance(r.condition, Budget) and r.condition.measure != "tokens" for r in rules):
        return None
    from tillerman.rules.prices import load_prices  # only budgets need it: most rule sets never load it

    return load_prices(overrides)


#: No rules, no grants: nothing is detected and nothing may be dispatched.
EMPTY = build_ruleset((), ())
