"""The normalized event vocabulary: every fact tillerman records is one of these.

Each event is a frozen msgspec Struct tagged by its ``kind`` (the name used in the
ledger's ``kind`` column and in docs/design.md "Normalized events (the monitor's vocabulary)"). Sources map whatever they read into
these; the ledger stores them; folds read them back. New fields always get defaults
so that old ledgers keep decoding (msgspec schema evolution).

Privacy: observations carry digests and sizes of prompts, tool arguments and
outputs, never their text. ``text`` fields exist only for payloads the user asked
to retain (``--retain-payloads``) and for tillerman's own intent texts; the rule set a
``ruleset_loaded`` records is configuration, not payload, and is always kept.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from tillerman.ledger.intents import Intent
from tillerman.ledger.usage import Tokens


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base of every normalized fact. ``thread_id``/``turn_id`` locate it."""

    thread_id: str | None = None
    turn_id: str | None = None


# -- sessions, turns, items ------------------------------------------------------


class ThreadStarted(Event, tag="thread_started"):
    parent_thread_id: str | None = None
    originator: str | None = None
    cli_version: str | None = None
    source_format: str | None = None
    cwd_digest: str | None = None  # the working directory the session names
    cwd: str | None = None  # the directory itself: only with --retain-payloads
    # The directory's last part and the git branch, where the source names them, kept
    # whatever --retain-payloads says: what a person knows a session by, far less telling
    # than the path or any content. UNSET (a source that names neither, or a ledger
    # written before they were read) is left out of the encoding, so those rows keep
    # their bytes and digests.
    project: str | None | msgspec.UnsetType = msgspec.UNSET
    git_branch: str | None | msgspec.UnsetType = msgspec.UNSET
    # Codex's own housekeeping threads (the TUI's title generation) are ephemeral and
    # carry a threadSource other than "user"; they are recorded, never supervised.
    ephemeral: bool = False
    thread_source: str | None = None

    @property
    def users_work(self) -> bool:
        return not self.ephemeral and self.thread_source in (None, "user")


TurnStatus = Literal["completed", "interrupted", "failed"]


#: What started a turn: a person's or client's ``turn/start`` ("user"), a goal's
#: continuation ("goal"), a queued message ("queue"), or "unknown" where the source
#: cannot tell (the app-server's wire marks none of them; see ``GoalUpdated``).
TurnTrigger = Literal["user", "goal", "queue", "unknown"]


class TurnStarted(Event, tag="turn_started"):
    # UNSET (a source that says nothing of it) is left out of the encoding, so turns
    # recorded before triggers were read keep their bytes and digests.
    trigger: TurnTrigger | msgspec.UnsetType = msgspec.UNSET
    # True when the trigger is inferred (the live wire) rather than read (a rollout's
    # ``turn_attribution``): a turn with no user message that started right after a
    # goal thread's turn ended.
    trigger_inferred: bool | msgspec.UnsetType = msgspec.UNSET


class TurnAlias(Event, tag="turn_alias"):
    """``turn_id`` (this source's id of a turn) and ``alias`` (the id another source
    gives the same turn) name one turn: a Claude Code transcript names a turn by the
    uuid of the message that opened it, as stream-json does, and knows its
    ``promptId``, the hooks' ``prompt_id``. Written before the source's ``TurnStarted``
    of that turn, so the fold never takes the two for consecutive turns."""

    alias: str


class TurnCompleted(Event, tag="turn_completed"):
    status: TurnStatus = "completed"
    duration_ms: int | None = None


class ItemStarted(Event, tag="item_started"):
    item_id: str
    item_type: str
    tool: str | None = None
    args_digest: str | None = None
    critical: bool = False
    external: bool = False
    # A shell call's command line, cut to ``tillerman.monitor.digest.COMMAND_LENGTH``: only with --retain-payloads.
    # UNSET (not retained, not a shell call, or a ledger written before commands were
    # kept) is left out of the encoding, so those rows keep their bytes and digests.
    command: str | msgspec.UnsetType = msgspec.UNSET


class ItemCompleted(Event, tag="item_completed"):
    item_id: str
    item_type: str
    status: str = "completed"
    exit_code: int | None = None
    tool: str | None = None
    args_digest: str | None = None
    output_digest: str | None = None
    output_size: int | None = None
    critical: bool = False
    external: bool = False


class UserMessage(Event, tag="user_message"):
    digest: str
    size: int
    client_id: str | None = None
    item_id: str | None = None
    text: str | None = None  # only with --retain-payloads


class AgentMessage(Event, tag="agent_message"):
    digest: str
    size: int
    item_id: str | None = None
    ack_tokens: tuple[str, ...] = ()
    text: str | None = None  # only with --retain-payloads


class DenyNotHonoured(Event, tag="deny_not_honoured"):
    """A tool call a hook of ours denied to deliver a message ran anyway (Claude Code
    reported its ``PostToolUse`` or ``PostToolUseFailure``): the deny, and the text it
    carried, did not reach the model as the call's result. ``client_id`` is the
    delivered intent's, ``item_id`` the call's ``tool_use_id``, ``status`` how it ended."""

    item_id: str
    client_id: str
    status: str


# -- goals: Codex's long-running objectives ----------------------------------------


class GoalUpdated(Event, tag="goal_updated"):
    """A thread's goal as its source last reported it: set by a client
    (``thread/goal/set``; no ``turn_id``), or updated at the end of a turn (the
    turn it names). Codex starts continuation turns while ``status`` is "active";
    "paused", "complete", "budgetLimited" (and "blocked", "usageLimited") end them.
    ``by`` is "tillerman" when tillerman's own request made the change (a stop)."""

    status: str
    objective_digest: str | None = None
    objective: str | None = None  # only with --retain-payloads
    origin: str | None = None  # "user" | "automatic", as the client that set it said
    token_budget: int | None = None
    tokens_used: int | None = None
    time_used_seconds: float | None = None
    by: str | None = None


class GoalCleared(Event, tag="goal_cleared"):
    """The thread's goal was removed (``thread/goal/clear``): no more continuations."""

    by: str | None = None


# -- usage: what the model responses cost ------------------------------------------


#: Where a usage figure was read: the app-server's ``thread/tokenUsage/updated``, a
#: rollout's ``token_count``, a Claude Code transcript's ``message.usage``, stream-json's
#: ``result``, a transcript's ``cost-state`` line, the app-server's ``account/usage/read``.
UsageSource = Literal["codex_live", "codex_rollout", "claude_transcript", "claude_stream", "claude_cost_state",
                      "codex_account"]


class Usage(Event, tag="usage", omit_defaults=True):
    """One model response's tokens (``tillerman.ledger.usage.Tokens``: cached input inside
    input, reasoning inside output), numbers only. ``total`` is the source's cumulative
    counter after this response where it keeps one (Codex), the second calculation the
    account checks the sum against. Duplicates are counted once by the account:
    ``response_key`` (Codex: the thread and its total) or, for Claude Code,
    (``message_id``, ``request_id``) as ccusage keys them, a ``sidechain`` entry also
    matching its parent by ``message_id``.

    Not an observation (``OBSERVATION_KINDS``): usage is an account, not activity, so it
    never moves a quiet timer or changes a decision unless a budget rule names it."""

    source_kind: UsageSource
    tokens: Tokens
    model: str | None = None
    total: Tokens | None = None
    context_window: int | None = None
    speed: str | None = None  # "fast" where the source says so; None: standard
    response_key: str | None = None
    message_id: str | None = None
    request_id: str | None = None
    sidechain: bool = False


class ModelUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A vendor's own per-model figures (Claude Code's ``modelUsage``, Codex's usage groups)."""

    model: str
    tokens: Tokens
    cost_usd: float | None = None


class UsageReported(Event, tag="usage_reported", omit_defaults=True):
    """A vendor's own cumulative account of a session, kept beside ours and never added to
    it: stream-json ``result`` (``total_cost_usd`` cumulative for the query: the latest
    counts, never a sum), the transcript's ``cost-state`` line, ``account/usage/read``'s
    ``estimatedUsageUsdMicros`` (as dollars)."""

    source_kind: UsageSource
    cost_usd: float | None = None
    tokens: Tokens | None = None
    models: tuple[ModelUsage, ...] = ()


class ApprovalRequested(Event, tag="approval_requested"):
    item_id: str
    approval_kind: str = "command"


class ApprovalResolved(Event, tag="approval_resolved"):
    item_id: str
    decision: str | None = None


class QueueEntry(msgspec.Struct, frozen=True):
    id: str
    client_id: str | None = None
    digest: str | None = None


class QueueChanged(Event, tag="queue_changed"):
    entries: tuple[QueueEntry, ...] = ()
    known: bool = True  # False: the source said "changed" without the contents


class QueueEntryRemoved(Event, tag="queue_entry_removed"):
    """An entry left the queue, and how (where the source says so): ``delivered`` (it
    ran as a turn, or was folded into the running one), ``withdrawn`` (taken back before
    it ran) or ``cleared`` (dropped by an interrupt that cancelled the queue)."""

    entry_id: str
    outcome: str
    client_id: str | None = None  # the message's own id, when the source names it
    reason: str | None = None  # the source's word for it, verbatim


class StatusChanged(Event, tag="status_changed"):
    status: str
    flags: tuple[str, ...] = ()


#: The status recorded when a source says a Claude Code session ended (its ``SessionEnd``
#: hook, or the CLI under ``tillerman claude`` exited).
SESSION_ENDED = "ended"
#: Codex's status of a thread no longer loaded: its session ended (``thread/closed``).
NOT_LOADED = "notLoaded"


class ThreadNamed(Event, tag="thread_named"):
    """The title a source gives the thread (Codex's thread name, a Claude Code
    transcript's custom title or summary): what a person names the session by, so it is
    kept whatever --retain-payloads says, cut to ``TITLE_LENGTH`` characters. None: the
    source cleared it. A thread's latest title is its title."""

    name: str | None = None

    @classmethod
    def of(cls, thread_id: str | None, name: str | None) -> ThreadNamed:
        """The event for ``name`` as the source wrote it: blank is no title."""
        name = " ".join(name.split())[:TITLE_LENGTH] if name else None
        return cls(thread_id=thread_id, name=name or None)


#: The longest title kept: a title is agent- or user-written text, recorded without
#: --retain-payloads, so only as much as a person reads as a name.
TITLE_LENGTH = 200


class Error(Event, tag="error"):
    message_digest: str
    will_retry: bool = False
    code: str | None = None


class Quarantined(Event, tag="quarantined"):
    """Bad input kept as evidence: where it was, how long, and why it was refused."""

    source: str
    offset: int
    length: int
    reason: str


class Undecodable(Event, tag="undecodable"):
    """A stored row this version cannot decode (written by a faulty or a newer tillerman).

    Never written: ``decode_stored`` puts it in place of the row's event, so every
    reader reports the row and goes on — one bad row never makes a ledger unreadable.
    ``raw`` keeps the stored payload as text, so an export still carries the evidence."""

    stored_kind: str = ""
    error: str = ""
    raw: str = ""


# -- intents and decisions (tillerman's own facts) -------------------------------


class IntentProposed(Event, tag="intent_proposed"):
    """The durable creation record of an intent; ``intent`` is its full record."""

    intent: Intent


class IntentTransition(Event, tag="intent_transition"):
    """An intent moved from one state to another, with the reason and its evidence."""

    intent_id: str
    from_state: str
    to_state: str
    reason: str
    evidence: dict[str, str | int | float | bool | None] = {}


class IntentEvidence(Event, tag="intent_evidence"):
    """Repeated evidence for a state already reached (a late reply, a second echo)."""

    intent_id: str
    state: str
    reason: str
    evidence: dict[str, str | int | float | bool | None] = {}


class DecisionRecorded(Event, tag="decision"):
    intent_id: str
    action: str
    reason: str
    rule_id: str | None = None
    rule_version: int | None = None
    ruleset_digest: str | None = None
    shadow: bool = False


class Report(Event, tag="report"):
    """A finding for a person (stall, approval wait, overdue intent); never dispatched."""

    rule_id: str
    rule_version: int
    finding: str
    ruleset_digest: str | None = None
    detail: dict[str, str | int | float | bool | None] = {}


class RulesetLoaded(Event, tag="ruleset_loaded"):
    """The daemon decides with this rule set from now on (at start, or after a reload)."""

    digest: str = ""
    previous_digest: str | None = None
    reason: str = "start"  # "start" | "reload" | "sighup"
    rules_path: str | None = None  # None: the built-in defaults
    config_path: str | None = None
    rules: int = 0
    patterns_digest: str | None = None
    # The rule set itself (rules and grants, as ``tillerman.rules.ruleset.ruleset_text``
    # writes it): configuration, not payload, so it is kept whatever ``--retain-payloads``
    # says. ``replay --check`` rebuilds the set from it to re-decide what it decided.
    # None in ledgers written before it was recorded.
    ruleset_text: str | None = None


class RulesetRejected(Event, tag="ruleset_rejected"):
    """A changed rule or config file failed validation; ``kept_digest`` keeps deciding."""

    error: str = ""
    kept_digest: str = ""
    reason: str = "reload"
    rules_path: str | None = None
    config_path: str | None = None


class RuleProposed(Event, tag="rule_proposed"):
    """A candidate rule (``tillerman rules propose``): bound to its digest, with the
    evidence it cites and the failure signature it predicts. Never in force by itself."""

    rule_id: str = ""
    rule_version: int = 0
    rule_digest: str = ""  # tillerman.rules.lifecycle.rule_digest: the rule without its status
    action: str = ""
    rule: str = ""  # the rule as TOML (status "proposed"), what a promotion installs
    evidence: tuple[str, ...] = ()
    signature: str | None = None
    proposed_by: str | None = None
    source_path: str | None = None


class RulePromoted(Event, tag="rule_promoted"):
    """An explicit promotion of a proposed rule (to shadow or active), or a rollback."""

    rule_id: str = ""
    rule_version: int = 0
    rule_digest: str = ""
    action: str = ""
    from_status: str = ""
    to_status: str = ""
    by: str = ""
    evaluation: str = ""
    rollback_trigger: str = ""
    rules_path: str | None = None  # the rules file the promotion wrote the rule into


class ReviewPending(Event, tag="review_pending"):
    """A reviewer is about to be asked at a checkpoint: appended durably before the call,
    so a restart that finds it without ``review_committed`` knows a call may have been
    spent and asks no second time (``tillerman.ledger.reviews``)."""

    checkpoint_id: str = ""
    checkpoint: str = ""  # before_dispatch | rescue | overdue | review
    reviewer: str = ""
    intent_id: str | None = None
    packet_digest: str = ""
    packet_size: int = 0
    probe: bool = False  # a calibration probe: never dispatched


class ReviewCommitted(Event, tag="review_committed"):
    """What a checkpoint's call came to: an accepted answer's disposition, or the reason
    it failed closed (``review_failed:<why>``, ``review_interrupted``)."""

    checkpoint_id: str = ""
    checkpoint: str = ""
    reviewer: str = ""
    intent_id: str | None = None
    outcome: str = ""  # "accepted" or the fail-closed reason
    disposition: str | None = None
    recommended_action: str | None = None
    corrections: int = 0
    answer_digest: str | None = None
    wall_ms: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    flags: tuple[str, ...] = ()  # e.g. "authority_language"
    answer: str | None = None  # the answer's JSON: only with --retain-payloads
    # The reviewer's own words a recommendation is built from (never the agent's): the text
    # of a recommended steer or queue, and each required correction with its proof.
    text: str | None = None
    required: tuple[str, ...] = ()


class NotificationSent(Event, tag="notification_sent"):
    """A ``[[notify]]`` sink took a group of notices (``tillerman.controller.notify.notices``).
    Each key names one notice and its step (``overdue:INTENT@ack``,
    ``escalation:INTENT@no_grant``, ``report:EVENT@1``, ``…@resolved``): what was sent is
    read back from these after a restart, never kept in memory only."""

    sink: str = ""
    # the thread the notices are about; not ``thread_id``: a notification is no event of
    # the thread, and folding it as one would make a thread known that was never seen
    thread: str | None = None
    keys: tuple[str, ...] = ()
    attempt: int = 1
    wall_ms: int | None = None


class NotificationFailed(Event, tag="notification_failed"):
    """One attempt to hand notices to a sink failed (it exited non-zero, answered an
    HTTP error, could not be reached, or hung past its timeout). ``retry_in`` is when the
    next attempt follows; None: the sink was given up on for these notices."""

    sink: str = ""
    thread: str | None = None
    keys: tuple[str, ...] = ()
    attempt: int = 1
    error: str = ""
    retry_in: float | None = None


class OwnerLabeled(Event, tag="owner_labeled"):
    """The owner's verdict on something tillerman did or said (``tillerman label``, the
    dashboard): the labels rules and reviewers are measured against
    (``tillerman.ledger.labels``). ``subject`` names it: ``intent:ID``, ``finding:EVENT_ID``
    (a rule's ``report`` event) or ``review:CHECKPOINT_ID`` (a reviewer's answer). A later
    label of the same subject replaces this one in the account; both stay on record."""

    subject: str = ""
    verdict: str = ""  # "useful" | "not_useful" | "harmful"
    note: str | None = None
    by: str = ""
    # the subject's thread; not ``thread_id``: a label is no event of the thread, and
    # folding it as one would make a thread known that was never seen
    thread: str | None = None


class NoticeResolved(Event, tag="notice_resolved"):
    """A person said a notice needs no more attention (``tillerman overdue resolve``, the
    dashboard): ``subject`` as the notifier names it (``overdue:INTENT``). The notifier
    tells its sinks it is resolved and repeats it no more; the intent itself is untouched."""

    subject: str = ""
    by: str = ""
    note: str | None = None
    thread: str | None = None


class Conflict(Event, tag="conflict"):
    """An append reused an existing ``event_id`` with different content."""

    event_id: str
    existing_digest: str
    offered_digest: str


class TailAccepted(Event, tag="tail_accepted"):
    """A person accepted a ledger shorter than its head anchor (``tillerman ledger
    accept-tail``): rows cut off the tail, or lost to a power failure under WAL."""

    by: str
    anchor_seq: int | None  # what the anchor named (None: the anchor file was missing)
    anchor_hash: str | None
    ledger_seq: int  # where the table ended when the shorter history was accepted


class LedgerArchived(Event, tag="ledger_archived"):
    """``tillerman ledger archive`` moved the rows of threads closed before ``before``
    into the segment file ``segment`` (``tillerman.ledger.segments``). The live chain
    keeps its seqs: verifying it walks through the segment for the missing ones, and
    this record, chained like any row, says which file must hold which rows.

    Every field has a default, so a later version may add some; a version without this
    event reads the row as undecodable and skips it (and cannot walk the gaps)."""

    segment: str = ""  # file name inside LEDGER.segments/
    first_seq: int = 0
    last_seq: int = 0
    rows: int = 0
    rows_digest: str = ""  # tillerman.ledger.segments.rows_digest of the moved rows, in seq order
    before: float = 0.0
    threads: int = 0
    intents: int = 0


AnyEvent = (
    ThreadStarted
    | TurnStarted
    | TurnAlias
    | TurnCompleted
    | ItemStarted
    | ItemCompleted
    | UserMessage
    | AgentMessage
    | DenyNotHonoured
    | GoalUpdated
    | GoalCleared
    | Usage
    | UsageReported
    | ApprovalRequested
    | ApprovalResolved
    | QueueChanged
    | QueueEntryRemoved
    | StatusChanged
    | ThreadNamed
    | Error
    | Quarantined
    | IntentProposed
    | IntentTransition
    | IntentEvidence
    | DecisionRecorded
    | Report
    | Conflict
    | RulesetLoaded
    | RulesetRejected
    | RuleProposed
    | RulePromoted
    | TailAccepted
    | LedgerArchived
    | ReviewPending
    | ReviewCommitted
    | NotificationSent
    | NotificationFailed
    | OwnerLabeled
    | NoticeResolved
    | Undecodable
)

#: Kinds that describe the observed session (as opposed to tillerman's own acts).
OBSERVATION_KINDS = frozenset(
    cls.__struct_config__.tag
    for cls in (
        ThreadStarted, TurnStarted, TurnAlias, TurnCompleted, ItemStarted, ItemCompleted,
        UserMessage, AgentMessage, DenyNotHonoured, GoalUpdated, GoalCleared, ApprovalRequested,
        ApprovalResolved, QueueChanged, QueueEntryRemoved, StatusChanged, ThreadNamed, Error,
    )
)

_encoder = msgspec.json.Encoder(order="deterministic")
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: AnyEvent) -> bytes:
    """Canonical JSON of an event (deterministic key order: the hash chain relies on it)."""
    return _encoder.encode(event)


def decode(payload: bytes | str) -> AnyEvent:
    return _decoder.decode(payload)


def decode_stored(payload: bytes | str, kind: str, thread_id: str | None = None,
                  turn_id: str | None = None) -> AnyEvent:
    """A stored row's event, or ``Undecodable`` in its place when it does not decode."""
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, TypeError) as exc:
        raw = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload)
        return Undecodable(thread_id=thread_id, turn_id=turn_id, stored_kind=str(kind), error=str(exc), raw=raw)


def kind_of(event: Event) -> str:
    return event.__struct_config__.tag


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """An event with its provenance, as a source hands it to the ledger.

    ``event_id`` is deterministic per source (file identity + byte offset + index
    within the record, or an app-server natural key), so re-reading, reconnecting or
    replaying never appends a fact twice. ``at`` is the source's time (epoch
    seconds, None when the format has none); ``offset``/``length`` give the byte
    range of a file-derived event.
    """

    event_id: str
    event: AnyEvent
    source: str
    at: float | None = None
    observed_at: float | None = None
    offset: int | None = None
    length: int | None = None


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger row read back: the envelope plus its place in the chain."""

    seq: int
    envelope: Envelope
    prev_hash: str
    hash: str
