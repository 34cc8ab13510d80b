"""The rule and config files' schemas: what each table may hold, as pydantic models.

``extra="forbid"``: a typo is an error, not a silently ignored key. Each spec turns
into a ``tillerman.rules.ruleset`` struct (``to_rule``, ``to_grant``, ``grants``), so
nothing downstream sees a pydantic object. ``tillerman.rules.validation`` words the
errors these raise; ``tillerman.rules.files`` loads files with them.
"""

from __future__ import annotations

import datetime
import string
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from tillerman.rules.notify import NoticeKind, NOTICE_KINDS, NotifySink, check_dashboard_url, check_webhook

from tillerman.rules.decision import Action
from tillerman.rules.detect import TEMPLATE_FIELDS
from tillerman.rules.durations import parse_duration
from tillerman.rules.errors import show
from tillerman.rules.owner import owner_grant
from tillerman.rules.review import Reviewer, ReviewerAdapter
from tillerman.rules.ruleset import (
    ANY,
    ApprovalWaiting,
    Budget,
    BudgetMeasure,
    BudgetScope,
    Condition,
    CriticalToolRunning,
    GoalBudgetLimited,
    Grant,
    GrantableAction,
    IntentOverdue,
    RepeatedFailure,
    Rule,
    RuleStatus,
    TurnLong,
    TurnQuiet,
)

Duration = Annotated[float, BeforeValidator(parse_duration)]


def parse_threads(value: object) -> str | tuple[str, ...]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ValueError(f'invalid threads {show(value)}; write "*", one thread id, or a list of thread ids')


Threads = Annotated[str | tuple[str, ...], BeforeValidator(parse_threads)]


# -- the file schemas ---------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _ConditionSpec(_Spec):
    struct: ClassVar[type[Condition]]

    def to_condition(self) -> Condition:
        return self.struct(**self.model_dump(exclude={"kind"}))


class TurnQuietSpec(_ConditionSpec):
    struct = TurnQuiet
    kind: Literal["turn_quiet"]
    for_seconds: Duration = Field(alias="for")


class RepeatedFailureSpec(_ConditionSpec):
    struct = RepeatedFailure
    kind: Literal["repeated_failure"]
    count: int = Field(ge=2, strict=True)
    within: Literal["turn"] = "turn"


class ApprovalWaitingSpec(_ConditionSpec):
    struct = ApprovalWaiting
    kind: Literal["approval_waiting"]
    for_seconds: Duration = Field(alias="for")


class CriticalToolRunningSpec(_ConditionSpec):
    struct = CriticalToolRunning
    kind: Literal["critical_tool_running"]
    for_seconds: Duration = Field(alias="for")


class IntentOverdueSpec(_ConditionSpec):
    struct = IntentOverdue
    kind: Literal["intent_overdue"]


class TurnLongSpec(_ConditionSpec):
    struct = TurnLong
    kind: Literal["turn_long"]
    for_seconds: Duration = Field(alias="for")


class GoalBudgetLimitedSpec(_ConditionSpec):
    struct = GoalBudgetLimited
    kind: Literal["goal_budget_limited"]


class BudgetSpec(_ConditionSpec):
    struct = Budget
    kind: Literal["budget"]
    measure: BudgetMeasure
    # strict: a limit written as a string is a typo, not a number to guess
    over: float = Field(gt=0, allow_inf_nan=False, strict=True)
    per: BudgetScope = "thread"

    @field_validator("over", mode="before")
    @classmethod
    def _whole_numbers_too(cls, over: object) -> object:
        """TOML writes 5 and 5.0 apart; either is a limit (a bool is not)."""
        return float(over) if isinstance(over, int) and not isinstance(over, bool) else over

    @field_validator("over")
    @classmethod
    def _context_is_a_share(cls, over: float, info: ValidationInfo) -> float:
        if info.data.get("measure") == "context" and over > 1:
            raise ValueError(f"context is a share of the window (0..1); write over = 0.9 for 90%, not {over}")
        return over

    @field_validator("per")
    @classmethod
    def _scope_fits_measure(cls, per: str, info: ValidationInfo) -> str:
        if info.data.get("measure") == "context" and per == "owner":
            raise ValueError('context is one thread\'s; write per = "turn", "thread", "goal" or "day"')
        return per


CONDITION_SPECS: dict[str, type[_ConditionSpec]] = {
    spec.struct.__struct_config__.tag: spec
    for spec in (TurnQuietSpec, RepeatedFailureSpec, ApprovalWaitingSpec, CriticalToolRunningSpec, IntentOverdueSpec,
                 TurnLongSpec, GoalBudgetLimitedSpec, BudgetSpec)
}
ConditionSpec = Annotated[
    TurnQuietSpec | RepeatedFailureSpec | ApprovalWaitingSpec | CriticalToolRunningSpec | IntentOverdueSpec | TurnLongSpec
    | GoalBudgetLimitedSpec | BudgetSpec,
    Field(discriminator="kind"),
]

#: Ids become grant subjects ("rule:ID") and dedup keys: no spaces, no colons.
ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
SUBJECT_PATTERN = r"\*|(owner|rule|reviewer):\S+"
#: Actions that send text to the agent need a text to send.
TEXT_ACTIONS = frozenset({Action.STEER, Action.QUEUE})


class RuleSpec(_Spec):
    id: str = Field(pattern=f"^{ID_PATTERN}$")
    version: int = Field(ge=1, strict=True)
    status: RuleStatus
    owner: str = Field(min_length=1)
    review_by: datetime.date
    expires: datetime.date | None = None
    threads: Threads = ANY
    condition: ConditionSpec
    action: Action
    # after condition and action: its validator reads them
    text: str | None = Field(default=None, validate_default=True)
    ack_deadline: Duration | None = None
    verify: str | None = Field(default=None, min_length=1)
    # the [[reviewer]] asked at before_dispatch; the config file must define it (rules.config)
    review: str | None = Field(default=None, pattern=f"^{ID_PATTERN}$")
    # a label for the account (``tillerman report --by task_class``), given to its intents
    task_class: str | None = Field(default=None, pattern=f"^{ID_PATTERN}$")

    @field_validator("text")
    @classmethod
    def _text_fits_action_and_condition(cls, text: str | None, info: ValidationInfo) -> str | None:
        action, condition = info.data.get("action"), info.data.get("condition")
        if text is None:
            if action in TEXT_ACTIONS:
                raise ValueError(f"missing; a {action} rule needs the text to send, e.g. text = \"Stop …; read … first.\"")
            return None
        if condition is not None:
            check_placeholders(text, condition.kind)
        return text

    def to_rule(self) -> Rule:
        # an unset task class is left out, so the rule set's digest stays what it was
        exclude = {"condition"} | ({"task_class"} if self.task_class is None else set())
        return Rule(**self.model_dump(exclude=exclude), condition=self.condition.to_condition())


class GrantSpec(_Spec):
    subject: str = Field(pattern=f"^({SUBJECT_PATTERN})$")
    actions: list[GrantableAction] = Field(min_length=1)
    threads: Threads = ANY

    def to_grant(self) -> Grant:
        return Grant(subject=self.subject, actions=frozenset(self.actions), threads=self.threads)


class ReviewerSpec(_Spec):
    """``[[reviewer]]``: a command that answers a review packet (``tillerman.rules.review``)."""

    name: str = Field(pattern=f"^{ID_PATTERN}$")
    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    timeout: Duration = 60.0
    max_per_intent: int = Field(default=2, ge=1, strict=True)
    max_per_thread_per_hour: int = Field(default=6, ge=1, strict=True)
    adapter: ReviewerAdapter | None = None
    # after this many ready_for_existing_gate answers in a row at before_dispatch, a known-bad probe
    probe_every: int | None = Field(default=None, ge=1, strict=True)
    # the HOME (and CODEX_HOME below it) the command runs with; None: a fresh scratch directory
    home: str | None = Field(default=None, min_length=1)
    # USD per UTC day; a cost the reviewer leaves unreported holds its reviews (tillerman.ledger.reviews)
    budget_usd_per_day: float | None = Field(default=None, gt=0, le=1_000_000, strict=True, allow_inf_nan=False)

    @field_validator("budget_usd_per_day")
    @classmethod
    def _a_budget_needs_a_cost(cls, budget: float | None, info: ValidationInfo) -> float | None:
        if budget is not None and info.data.get("adapter") == "codex-exec-json":
            raise ValueError("codex exec reports tokens, never a cost, so this reviewer's spend is never known and"
                             " every review would be held; remove the key, or limit it with max_per_thread_per_hour")
        return budget

    def to_reviewer(self) -> Reviewer:
        return Reviewer(**self.model_dump(exclude={"command"}), command=tuple(self.command))


class NotifySpec(_Spec):
    """``[[notify]]``: a command or a webhook that people's notices are handed to
    (``tillerman.rules.notify``)."""

    name: str = Field(pattern=f"^{ID_PATTERN}$")
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    allow_remote: bool = Field(default=False, strict=True)
    # after command and allow_remote: its validator reads them
    webhook: str | None = Field(default=None, validate_default=True)
    group_window: Duration = 10.0
    repeat: Duration | None = None
    kinds: list[NoticeKind] = Field(default=list(NOTICE_KINDS), min_length=1)
    timeout: Duration = 10.0

    @field_validator("webhook")
    @classmethod
    def _one_way_to_send(cls, webhook: str | None, info: ValidationInfo) -> str | None:
        command = info.data.get("command")
        if webhook is None and command is None and "command" in info.data:
            raise ValueError('missing; add webhook = "http://127.0.0.1:9000/tillerman" or command = ["notify-send"]')
        if webhook is not None and command is not None:
            raise ValueError("give command or webhook, not both; write a second [[notify]] for the other")
        return None if webhook is None else check_webhook(webhook, info.data.get("allow_remote", False))

    def to_sink(self) -> NotifySink:
        return NotifySink(name=self.name, command=None if self.command is None else tuple(self.command),
                          webhook=self.webhook, group_window=self.group_window, repeat=self.repeat,
                          kinds=tuple(dict.fromkeys(self.kinds)), timeout=self.timeout)


class RulesFile(_Spec):
    rule: list[RuleSpec] = []


class DefaultsSpec(_Spec):
    """``[defaults]``: what holds without a grant written down."""

    # strict: "false" (a string) is not false; authority is not guessed from a typo
    owner_grant: bool = Field(default=True, strict=True)
    # the built-in usage report (a day's cost, most of the context window) to a person
    usage_report: bool = Field(default=True, strict=True)


class DashboardSpec(_Spec):
    """``[dashboard]``: where the page is reached, so that notices link to a thread's page."""

    url: str | None = None

    @field_validator("url")
    @classmethod
    def _a_plain_address(cls, url: str | None) -> str | None:
        return None if url is None else check_dashboard_url(url)


class ConfigFile(BaseModel):
    # The config file also holds command patterns and client settings, which their
    # own loaders validate; the [[grant]] tables and [defaults] are ours.
    model_config = ConfigDict(extra="ignore", frozen=True)
    grant: list[GrantSpec] = []
    defaults: DefaultsSpec = DefaultsSpec()
    reviewer: list[ReviewerSpec] = []  # names checked unique by tillerman.rules.files.load_config
    notify: list[NotifySpec] = []  # names checked unique by tillerman.rules.files.load_config
    dashboard: DashboardSpec = DashboardSpec()

    def sinks(self) -> tuple[NotifySink, ...]:
        return tuple(spec.to_sink() for spec in self.notify)

    def reviewers(self) -> tuple[Reviewer, ...]:
        return tuple(spec.to_reviewer() for spec in self.reviewer)

    def grants(self) -> tuple[Grant, ...]:
        """The grants in force: the local owner's built-in one (unless ``[defaults]
        owner_grant = false``), then the file's ``[[grant]]`` tables."""
        builtin = (owner_grant(),) if self.defaults.owner_grant else ()
        return builtin + tuple(spec.to_grant() for spec in self.grant)


#: No config file at all: the built-in owner grant and nothing else.
NO_CONFIG = ConfigFile()


class PatternsSpec(BaseModel):
    """``[patterns]`` (``tillerman.rules.config.load_patterns`` checks each expression)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    critical: list[str] | None = None
    external: list[str] | None = None
#: The config file's plain tables (``[name]``, not ``[[name]]``) validated here.
TABLES: dict[str, type[BaseModel]] = {"defaults": DefaultsSpec, "dashboard": DashboardSpec}


def check_placeholders(text: str, kind: str) -> None:
    """Refuse a rule text with a placeholder its condition cannot fill, or a malformed one."""
    available = TEMPLATE_FIELDS[kind]
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"invalid template ({exc}); write literal braces as {{{{ and }}}}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in available:
            names = ", ".join(f"{{{n}}}" for n in available)
            raise ValueError(f"unknown placeholder {show('{' + name + '}')} for kind {kind}; available: {names}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} takes no format spec or conversion; write {{{name}}}")
