"""The config file's price overrides, per model, in USD per million tokens::

    [prices."gpt-5.5"]
    input = 5.0            # uncached input
    cached_input = 0.5     # cache reads
    output = 30.0          # output, reasoning included
    context_window = 1050000

    [prices."my-proxy-model"]  # a model the table has no price for: input and output
    input = 1.25
    output = 10

Keys: ``input``, ``cached_input``, ``cache_write`` (5-minute writes), ``cache_write_1h``,
``output``, ``context_window`` (tokens), ``fast`` (what fast mode multiplies a cost
by). A key left out keeps the table's base rate for the model the name matches; a
table that gives any rate drops the table's long-context tiers for it, since the rates
given are the user's at every size (``tillerman.rules.prices.overridden``). Every error names the file, the
line, the model and the key, like every other config error.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tillerman.rules.errors import RuleSetError, show
from tillerman.rules.prices import PriceOverride, Rates
from tillerman.rules.toml_source import locate, parse_toml
from tillerman.rules.validation import validation_report

PER_MILLION = 1_000_000
#: $1 a token: no model costs that; a larger figure is a typo.
MAX_PER_MILLION = 1_000_000.0
PerMillion = Annotated[float, Field(ge=0, le=MAX_PER_MILLION, allow_inf_nan=False)]
EXAMPLE = '[prices."gpt-5.5"] followed by input = 5.0 and output = 30.0'


class PriceSpec(BaseModel):
    """``[prices."MODEL"]``: strict, so ``"1.25"`` (a string) is not a price."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    input: PerMillion | None = None
    cached_input: PerMillion | None = None
    cache_write: PerMillion | None = None
    cache_write_1h: PerMillion | None = None
    output: PerMillion | None = None
    context_window: int | None = Field(default=None, gt=0, le=10**9)
    fast: float | None = Field(default=None, ge=1, le=100, allow_inf_nan=False)

    def to_override(self) -> PriceOverride:
        rates = {name: value / PER_MILLION for name in Rates.__struct_fields__
                 if (value := getattr(self, name)) is not None}
        return PriceOverride(rates=Rates(**rates), context_window=self.context_window, fast=self.fast)


def load_price_overrides(text: str, source: str) -> dict[str, PriceOverride]:
    """The ``[prices."MODEL"]`` tables of a config file (none: an empty mapping), or
    ``RuleSetError`` with a line for each problem."""
    table = parse_toml(text, source).get("prices")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise RuleSetError(f"{source}:{locate(text, ('prices',))}: top level field prices: must be a table of models,"
                           f" written {EXAMPLE}")
    problems: list[tuple[int, str]] = []
    overrides: dict[str, PriceOverride] = {}
    for model, entry in table.items():
        where = f'{source}:{{line}}: prices."{model}"'
        if not model.strip():
            problems.append(_at(text, (), where, "the model name is empty; write the name the agent reports"))
        elif not isinstance(entry, dict):
            problems.append(_at(text, (model,), where, f"must be a table of prices (got {show(entry)}); write"
                                                       f' [prices."{model}"] followed by input = 1.25'))
        else:
            try:
                overrides[model] = PriceSpec.model_validate(entry).to_override()
            except ValidationError as exc:
                problems.extend(_describe(error, model, text, where) for error in exc.errors())
    if problems:
        raise RuleSetError(validation_report(problems, lambda problem: problem, source))
    return overrides


def _at(text: str, loc: tuple[str, ...], where: str, problem: str) -> tuple[int, str]:
    line = locate(text, ("prices", *loc))
    return line, f"{where.format(line=line)}: {problem}"


def _describe(error: dict[str, Any], model: str, text: str, where: str) -> tuple[int, str]:
    key = str(error["loc"][0]) if error["loc"] else ""
    value = error.get("input")
    match error["type"]:
        case "extra_forbidden":
            problem = f"unknown field; expected one of {', '.join(PriceSpec.model_fields)}"
        case "int_type" | "int_from_float" | "greater_than" | "less_than_equal" if key == "context_window":
            problem = f"must be a whole number of tokens from 1 to 1000000000 (got {show(value)})"
        case _ if key == "fast":
            problem = f"must be a number from 1 to 100, what fast mode multiplies a cost by (got {show(value)})"
        case _:
            problem = (f"must be a number of USD per million tokens from 0 to {MAX_PER_MILLION:,.0f} (got"
                       f" {show(value)}); write it like {key} = 1.25")
    return _at(text, (model, key), f"{where} field {key}", problem)
