"""What a thread spent, per budget scope, as the fold keeps it for the budget rules.

A ``budget`` rule (``tillerman.rules.ruleset.Budget``) compares one figure of one scope
instance with its limit: the tokens or the cost of the running turn, of the thread, of
the thread's goal, of the thread's UTC day, of the owner's UTC day (every supervised
thread of the ledger together), or the context used by the thread's last response. The
fold adds each counted response to the scopes it falls in (``Spent.plus``), once per
response, so nothing is summed again when a rule asks; a scope whose instance changed
(a new turn, a new day, another goal) starts again from nothing. Which report of a
response counts is the usage account's rule (``tillerman.ledger.usage_account.Dedup``):
a better duplicate replaces the earlier copy, which is taken back from the scopes it was
counted in (``Where``) where those are still the thread's current instances.

Cost is not kept here: prices are the rule set's (``tillerman.rules.budget`` prices a
scope's ``parts``), and the fold must read the same for every reader of the ledger
(``ledger verify`` folds it again without any price table). So each scope keeps its
tokens split by what a price depends on: the model, the speed, and the largest tier
floor (``TIER_FLOORS``) the response's input exceeded, since a vendor prices a response
above its threshold wholly at higher rates and a sum of small responses must not be
priced as one large one.
"""

from __future__ import annotations

import msgspec

from tillerman.ledger.usage import ZERO, Tokens

#: The input sizes above which a vendor prices a whole response at its long-context rates,
#: as LiteLLM names them (``*_above_200k_tokens``, ``*_above_272k_tokens``).
TIER_FLOORS = (200_000, 272_000)

#: Scopes a budget is counted per (``Budget.per``).
SCOPES = ("turn", "thread", "goal", "day", "owner")


def tier_floor(tokens: Tokens) -> int:
    """The largest tier floor the response's input exceeds; 0: under every one."""
    return max((floor for floor in TIER_FLOORS if tokens.input > floor), default=0)


class Part(msgspec.Struct, frozen=True, array_like=True):
    """A scope's tokens of one model at one speed, from responses in one tier band."""

    model: str | None
    speed: str | None
    floor: int
    tokens: Tokens


class Spent(msgspec.Struct, frozen=True, kw_only=True):
    """What one scope instance spent: ``instance`` names it (the turn id, the UTC day
    ``YYYY-MM-DD``, the goal, ``thread``); ``tokens`` is the sum of its responses."""

    instance: str
    tokens: Tokens = ZERO
    responses: int = 0
    parts: tuple[Part, ...] = ()

    def plus(self, tokens: Tokens, model: str | None, speed: str | None) -> Spent:
        floor = tier_floor(tokens)
        parts = list(self.parts)
        for index, part in enumerate(parts):
            if (part.model, part.speed, part.floor) == (model, speed, floor):
                parts[index] = Part(model, speed, floor, part.tokens + tokens)
                break
        else:
            parts.append(Part(model, speed, floor, tokens))
        return Spent(instance=self.instance, tokens=self.tokens + tokens, responses=self.responses + 1,
                     parts=tuple(parts))

    def minus(self, tokens: Tokens, model: str | None, speed: str | None) -> Spent:
        """One counted response taken back (a better duplicate replaced it); its part
        goes when nothing is left in it, so the price of nothing is never asked."""
        key = (model, speed, tier_floor(tokens))
        parts = tuple(
            Part(part.model, part.speed, part.floor, part.tokens - tokens)
            if (part.model, part.speed, part.floor) == key else part
            for part in self.parts)
        return Spent(instance=self.instance, tokens=self.tokens - tokens, responses=self.responses - 1,
                     parts=tuple(part for part in parts if not part.tokens.is_zero()))


def add_to(spent: Spent | None, instance: str | None, tokens: Tokens, model: str | None,
           speed: str | None) -> Spent | None:
    """``spent`` with one response added, started again when its instance is not
    ``instance``; None when the response falls in no instance of the scope (no turn, no
    time, no goal)."""
    if instance is None:
        return None
    if spent is None or spent.instance != instance:
        spent = Spent(instance=instance)
    return spent.plus(tokens, model, speed)


def take_from(spent: Spent | None, instance: str | None, tokens: Tokens, model: str | None,
              speed: str | None) -> Spent | None:
    """``spent`` with a response counted in ``instance`` taken back; unchanged when the
    scope has moved on to another instance since (that one never held the response)."""
    if spent is None or instance is None or spent.instance != instance:
        return spent
    return spent.minus(tokens, model, speed)


class Where(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Where the fold counted a response: the scope instances it was added to, and the
    model and speed of its part, so a better duplicate can take it back."""

    thread_id: str
    turn: str | None = None
    day: str | None = None
    goal: str | None = None
    owner: bool = False  # added to the owner's day (the thread was supervised)
    model: str | None = None
    speed: str | None = None


class UsageFigures(msgspec.Struct, frozen=True, kw_only=True):
    """A thread's budget figures after its last counted response: each scope's instance
    and what it spent, the context the response used, and where it came from. Replaced
    (never changed) by each counted response, so an unchanged thread keeps the same
    object and comparing two is cheap."""

    thread: Spent
    turn: Spent | None = None
    day: Spent | None = None
    goal: Spent | None = None
    owner: Spent | None = None  # the owner's UTC day, as it stood after this response
    last_input: int = 0  # the last response's input, cache included
    context_window: int | None = None
    model: str | None = None  # the last response's model (its window, when the source names none)
    source_kind: str = ""
    seq: int = 0  # the ledger row of the last counted response

    def without(self, where: Where, tokens: Tokens, owner: Spent | None) -> UsageFigures:
        """These figures with one response counted at ``where`` taken back; ``owner`` is
        the owner's day as it stands after that."""
        model, speed = where.model, where.speed
        return msgspec.structs.replace(
            self, thread=self.thread.minus(tokens, model, speed),
            turn=take_from(self.turn, where.turn, tokens, model, speed),
            day=take_from(self.day, where.day, tokens, model, speed),
            goal=take_from(self.goal, where.goal, tokens, model, speed),
            owner=owner if self.owner is not None else None)

    def scope(self, per: str) -> Spent | None:
        return self.thread if per == "thread" else getattr(self, per)

    @property
    def context(self) -> float | None:
        """Last input over the context window (0..1); None without a window."""
        if not self.context_window:
            return None
        return self.last_input / self.context_window
