"""What a model's tokens cost: a dated price table, how a model name finds its price,
and the cost of one response (docs/design.md "The usage account", "Prices").

The table is a trimmed copy of LiteLLM's ``model_prices_and_context_window.json`` (the
data ccusage prices from), in LiteLLM's own field names and per token in USD: the
bundled ``prices.json`` beside this module, or the one ``tillerman prices import``
stored in the user's data folder (``imported_table_path``), with the config file's
``[prices."MODEL"]`` overrides on top (``load_prices``). ``tillerman.rules.prices_trim``
makes a table from a full LiteLLM file.

A cost is never a guess: a response with no model, or whose model the table cannot
price, has ``usd = None`` and the reason (``no_model``, ``no_price``), never 0. Every
cost carries the table's date.

Prices are configuration the rules and the usage account read; this module imports
only the ledger's ``Tokens`` and its file reader.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from tillerman.ledger.paths import NotARegularFile, read_regular
from tillerman.ledger.usage import MAX_RESPONSE_TOKENS, Tokens

#: The rate fields read, LiteLLM's name for each ``Rates`` field (per token, USD).
RATE_FIELDS: dict[str, str] = {
    "input": "input_cost_per_token",
    "cached_input": "cache_read_input_token_cost",
    "cache_write": "cache_creation_input_token_cost",
    "cache_write_1h": "cache_creation_input_token_cost_above_1hr",
    "output": "output_cost_per_token",
}
#: A long-context tier: a rate field with ``_above_<N>k_tokens`` after it.
TIER_SUFFIX = re.compile(r"_above_([0-9]{1,5})k_tokens\Z")
CONTEXT_FIELD = "max_input_tokens"
#: ``provider_specific_entry.fast``: what fast mode multiplies a response's cost by.
FAST_HOLDER, FAST_FIELD = "provider_specific_entry", "fast"
#: No token costs a dollar; a larger figure is a price per million or per thousand
#: tokens written into a per-token field.
MAX_RATE_USD = 1.0
MAX_FAST_FACTOR = 100.0
#: Read at most this much of a price file (LiteLLM's whole file is ~3.5 MB).
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Cache-rate rules when the table gives none (docs/design.md "Prices"): Anthropic
#: charges 1.25x input for a 5-minute write, 2x for a 1-hour one, 0.1x for a read;
#: OpenAI bills a write as plain input and, without a stated read rate, so does ccusage.
CLAUDE_CACHE_WRITE, CACHE_WRITE_1H, CLAUDE_CACHE_READ = 1.25, 2.0, 0.1

NO_MODEL = "no_model"
NO_PRICE = "no_price"


class PriceFileError(ValueError):
    """A price table or price file that cannot be used; the message is one line naming
    the model and the field."""


class Rates(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Rates per token in USD; None: not given (a derived rate applies)."""

    input: float | None = None
    cached_input: float | None = None
    cache_write: float | None = None
    cache_write_1h: float | None = None
    output: float | None = None


class Tier(msgspec.Struct, frozen=True, kw_only=True):
    """The rates of a response whose input (cache included) is above ``above`` tokens."""

    above: int
    rates: Rates


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One table entry: base rates (``input`` and ``output`` always given), the
    long-context tiers by threshold, the context window, the fast-mode factor."""

    rates: Rates
    tiers: tuple[Tier, ...] = ()
    context_window: int | None = None
    fast: float | None = None


class Cost(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A response's cost in USD, or None with ``missing`` saying why; ``date``: the
    price table's."""

    usd: float | None
    missing: str | None = None
    date: str


class PriceOverride(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A config file's ``[prices."MODEL"]``, per token (the config says per million)."""

    rates: Rates = Rates()
    context_window: int | None = None
    fast: float | None = None


class PriceTable:
    """The models' prices with the table's ``date``, ``source`` and ``digest`` (the
    sha256 of the LiteLLM file it was trimmed from). Matching a name is cached."""

    def __init__(self, models: Mapping[str, ModelPrice], *, date: str, source: str, digest: str) -> None:
        self.models = dict(models)
        self.date, self.source, self.digest = date, source, digest
        self._matched: dict[str, str | None] = {}
        self._windowed: dict[str, str | None] = {}
        self._rates: dict[tuple[str, int], Rates] = {}  # (key, tiers passed) -> effective rates
        self._with_window = [key for key, price in self.models.items() if price.context_window is not None]

    def match(self, model: str) -> str | None:
        """The table key that prices ``model``, by ccusage's rule (``best_key``)."""
        if model not in self._matched:
            self._matched[model] = best_key(model, self.models)
        return self._matched[model]

    def context_window(self, model: str) -> int | None:
        """The model's context window (LiteLLM's ``max_input_tokens``), matched as
        ccusage matches it: among the entries that have one."""
        if model not in self._windowed:
            self._windowed[model] = best_key(model, self._with_window)
        key = self._windowed[model]
        return None if key is None else self.models[key].context_window

    def cost(self, model: str | None, tokens: Tokens, *, speed: str | None = None) -> Cost:
        """What one response cost. Input above a tier's threshold (cache included)
        prices the whole response at that tier's rates; ``speed="fast"`` multiplies by
        the model's fast factor (no factor: no price, not the standard price)."""
        if not model:
            return Cost(usd=None, missing=NO_MODEL, date=self.date)
        key = self.match(model)
        if key is None:
            return Cost(usd=None, missing=NO_PRICE, date=self.date)
        price = self.models[key]
        factor = 1.0
        if speed == "fast":
            if price.fast is None:
                return Cost(usd=None, missing=NO_PRICE, date=self.date)
            factor = price.fast
        return Cost(usd=response_cost(self._effective(key, price, tokens.input), tokens) * factor, date=self.date)

    def _effective(self, key: str, price: ModelPrice, input_tokens: int) -> Rates:
        """``effective_rates``, derived once per model and tier rather than per response
        (``tillerman usage`` prices tens of thousands of responses of a few models)."""
        passed = 0
        for tier in price.tiers:  # ascending: the rates are those of the last tier passed
            if input_tokens <= tier.above:
                break
            passed += 1
        rates = self._rates.get((key, passed))
        if rates is None:
            rates = self._rates[key, passed] = effective_rates(price, input_tokens, claude=is_claude(key))
        return rates

    def with_overrides(self, overrides: Mapping[str, PriceOverride]) -> PriceTable:
        """This table with the config's overrides: each names a model, and its rates
        replace those of the entry the name matches (kept under the name itself);
        a model the table cannot price must give ``input`` and ``output``."""
        models = dict(self.models)
        for model, override in overrides.items():
            models[model] = overridden(model, self.models.get(self.match(model) or ""), override)
        return PriceTable(models, date=self.date, source=self.source, digest=self.digest)


def overridden(model: str, base: ModelPrice | None, override: PriceOverride) -> ModelPrice:
    """The entry ``override`` makes of the table's ``base``. Rates given are the user's
    price at every size: the table's long-context tiers go with them (a tier would
    otherwise price a large response at the table's rates, above the user's). An
    override of only the window or the fast factor keeps the tiers."""
    given = {name: value for name in RATE_FIELDS if (value := getattr(override.rates, name)) is not None}
    if base is None:
        if "input" not in given or "output" not in given:
            raise PriceFileError(f'[prices."{model}"]: the price table has no price for {model}; give both input and'
                                 " output")
        base = ModelPrice(rates=Rates())
    return ModelPrice(rates=msgspec.structs.replace(base.rates, **given), tiers=() if given else base.tiers,
                      context_window=override.context_window or base.context_window,
                      fast=override.fast or base.fast)


def is_claude(key: str) -> bool:
    return "claude" in key


def effective_rates(price: ModelPrice, input_tokens: int, *, claude: bool) -> Rates:
    """Every rate of a response with ``input_tokens`` of input: the highest tier it is
    above, else the base; a rate the table leaves out derived from that input rate."""
    rates = price.rates
    for tier in price.tiers:  # ascending
        if input_tokens > tier.above:
            rates = msgspec.structs.replace(tier.rates, input=_given(tier.rates.input, price.rates.input),
                                            output=_given(tier.rates.output, price.rates.output))
    base = rates.input
    return Rates(
        input=base, output=rates.output,
        cached_input=_given(rates.cached_input, base * (CLAUDE_CACHE_READ if claude else 1)),
        cache_write=_given(rates.cache_write, base * (CLAUDE_CACHE_WRITE if claude else 1)),
        cache_write_1h=_given(rates.cache_write_1h, base * CACHE_WRITE_1H),
    )


def _given(rate: float | None, otherwise: float | None) -> float | None:
    return otherwise if rate is None else rate


def response_cost(rates: Rates, tokens: Tokens) -> float:
    """Each part of the input at its own rate, output (reasoning inside it) at the
    output rate: cached input and cache writes are parts of input, never added twice."""
    five_minute = tokens.cache_write - tokens.cache_write_1h
    return (tokens.uncached_input * rates.input + tokens.cached_input * rates.cached_input
            + five_minute * rates.cache_write + tokens.cache_write_1h * rates.cache_write_1h
            + tokens.output * rates.output)


# -- matching a model name, as ccusage does (rust/crates/ccusage/src/pricing.rs) ---------

#: A date suffix (``-20250514``) does not make another version of the model; any other
#: number after a key ending in a digit does (``gpt-5`` does not price ``gpt-5-1``).
DATE_DIGITS = 8


def best_key(model: str, keys: Iterable[str]) -> str | None:
    """``model`` itself when it is a key; else the longest key that contains it or that
    it contains, at non-alphanumeric boundaries, with ``.`` and ``@`` read as ``-``
    (ties: the first in text order). ``anthropic/claude-sonnet-4-20250514`` finds
    ``claude-sonnet-4-20250514``; ``gpt-5.1`` does not find ``gpt-5``."""
    keys = keys if isinstance(keys, (dict, set, frozenset)) else list(keys)
    if model in keys:
        return model
    normalized = _normalized(model)
    found = [key for key in keys if key_matches(key, model, normalized)]
    return min(found, key=lambda key: (-len(key), key), default=None)


def key_matches(key: str, model: str, normalized_model: str) -> bool:
    if _contains(model, key) or _contains(key, model):
        return True
    normalized_key = _normalized(key)
    return _contains(normalized_model, normalized_key) or _contains(normalized_key, normalized_model)


def _normalized(name: str) -> str:
    return name.replace(".", "-").replace("@", "-")


def _contains(value: str, key: str) -> bool:
    """Whether ``key`` occurs in ``value`` with no letter or digit just before it and
    a suffix after it that does not continue the name or its version."""
    if not key:
        return False
    start = value.find(key)
    while start != -1:
        before = value[start - 1] if start else ""
        if not before.isascii() or not before.isalnum():
            if _suffix_allows(key, value[start + len(key):]):
                return True
        start = value.find(key, start + 1)
    return False


def _suffix_allows(key: str, suffix: str) -> bool:
    if not suffix:
        return True
    if suffix[0].isascii() and suffix[0].isalnum():
        return False
    return not _starts_another_version(key, suffix)


def _starts_another_version(key: str, suffix: str) -> bool:
    if not key[-1].isdigit() or suffix[0] not in "-.":
        return False
    digits = len(suffix[1:]) - len(suffix[1:].lstrip("0123456789"))
    if digits == 0:
        return False
    after = suffix[1 + digits: 2 + digits]
    return not (digits == DATE_DIGITS and (not after or not (after.isascii() and after.isalnum())))


# -- reading a table --------------------------------------------------------------------


def check_rate(model: str, field: str, value: Any) -> float:
    """A per-token rate as a price file gives it, or ``PriceFileError`` naming both."""
    where = f'model "{model}" field {field}'
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PriceFileError(f"{where}: {_shown(value)} is not a number")
    if not math.isfinite(value):
        raise PriceFileError(f"{where}: {_shown(value)} is not a finite number")
    if value < 0:
        raise PriceFileError(f"{where}: {_shown(value)} is negative")
    if value > MAX_RATE_USD:
        raise PriceFileError(f"{where}: {_shown(value)} is above ${MAX_RATE_USD:g} a token (a price per million"
                             " tokens in a per-token field?)")
    return float(value)


def check_window(model: str, value: Any) -> int:
    where = f'model "{model}" field {CONTEXT_FIELD}'
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # LiteLLM writes 128000.0
    if isinstance(value, bool) or not whole:
        raise PriceFileError(f"{where}: {_shown(value)} is not a whole number of tokens")
    if not 0 < value <= MAX_RESPONSE_TOKENS:
        raise PriceFileError(f"{where}: {_shown(value)} is out of range (1 to {MAX_RESPONSE_TOKENS})")
    return int(value)


def check_fast(model: str, value: Any) -> float:
    where = f'model "{model}" field {FAST_HOLDER}.{FAST_FIELD}'
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PriceFileError(f"{where}: {_shown(value)} is not a finite number")
    if not 1 <= value <= MAX_FAST_FACTOR:
        raise PriceFileError(f"{where}: {_shown(value)} is out of range (1 to {MAX_FAST_FACTOR:g})")
    return float(value)


def model_price(model: str, entry: Any) -> ModelPrice | None:
    """A LiteLLM entry as a price, checked field by field (``PriceFileError``); None
    when it has no input or no output rate (an entry ccusage ignores too)."""
    if not isinstance(entry, Mapping):
        raise PriceFileError(f'model "{model}": {_shown(entry)} is not an object of prices')
    if not all(isinstance(field, str) for field in entry):
        raise PriceFileError(f'model "{model}": a field name is not a string')
    base = _rates(model, entry, "")
    if base.input is None or base.output is None:
        return None
    thresholds = sorted({int(m.group(1)) for field in entry if (m := TIER_SUFFIX.search(field))
                         and field[: m.start()] in RATE_FIELDS.values()})
    tiers = tuple(Tier(above=k * 1000, rates=_rates(model, entry, f"_above_{k}k_tokens")) for k in thresholds)
    window = entry.get(CONTEXT_FIELD)
    holder = entry.get(FAST_HOLDER)
    if holder is not None and not isinstance(holder, Mapping):
        raise PriceFileError(f'model "{model}" field {FAST_HOLDER}: {_shown(holder)} is not an object')
    fast = (holder or {}).get(FAST_FIELD)
    return ModelPrice(rates=base, tiers=tiers, context_window=None if window is None else check_window(model, window),
                      fast=None if fast is None else check_fast(model, fast))


def _rates(model: str, entry: Mapping[str, Any], suffix: str) -> Rates:
    return Rates(**{name: check_rate(model, field + suffix, entry[field + suffix])
                    for name, field in RATE_FIELDS.items() if entry.get(field + suffix) is not None})


def table_from_document(document: Any, where: str) -> PriceTable:
    """A stored table (``prices_trim.table_document``'s form), checked throughout."""
    if not isinstance(document, Mapping) or not isinstance(document.get("models"), Mapping):
        raise PriceFileError(f"{where}: not a tillerman price table (no models object)")
    for field in ("date", "source", "digest"):
        if not isinstance(document.get(field), str):
            raise PriceFileError(f"{where}: field {field} is missing or not text")
    try:
        models = {model: price for model, entry in document["models"].items()
                  if (price := model_price(model, entry)) is not None}
    except PriceFileError as exc:
        raise PriceFileError(f"{where}: {exc}") from None
    return PriceTable(models, date=document["date"], source=document["source"], digest=document["digest"])


def read_json(path: str | os.PathLike) -> tuple[bytes, Any]:
    """A JSON file's bytes and value, or ``PriceFileError`` in one line (not a regular file, too
    large, not UTF-8, not JSON). ``NaN`` and ``Infinity`` are read as numbers so that
    the field holding one is named when it is refused."""
    try:
        data, _ = read_regular(path, limit=MAX_FILE_BYTES + 1)
    except NotARegularFile as exc:
        raise PriceFileError(f"{exc}; give a JSON file") from None
    except OSError as exc:
        raise PriceFileError(f"{exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PriceFileError(f"larger than {MAX_FILE_BYTES // 2**20} MB; not a price file")
    try:
        return data, json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise PriceFileError("not UTF-8 text; give LiteLLM's model_prices_and_context_window.json") from None
    except (ValueError, RecursionError) as exc:
        raise PriceFileError(f"not JSON ({str(exc)[:120]})") from None


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- where the table comes from ----------------------------------------------------------


def imported_table_path() -> Path:
    """Where ``tillerman prices import`` keeps the table it made:
    ``$XDG_DATA_HOME/tillerman/prices.json`` (``~/.local/share/tillerman/prices.json``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "tillerman" / "prices.json"


def bundled_table() -> PriceTable:
    text = resources.files("tillerman.rules").joinpath("prices.json").read_text(encoding="utf-8")
    return table_from_document(json.loads(text), "the bundled price table")


def load_prices(overrides: Mapping[str, PriceOverride] | None = None) -> PriceTable:
    """The price table in force: the imported one when ``tillerman prices import`` made
    one, else the bundled one; then the config's ``[prices."MODEL"]`` overrides.
    Raises ``PriceFileError`` (one line) for an imported table someone spoiled."""
    path = imported_table_path()
    if not path.exists():
        table = bundled_table()
    else:
        try:
            document = read_json(path)[1]
        except PriceFileError as exc:
            raise PriceFileError(f"{path}: {exc}") from None
        table = table_from_document(document, str(path))
    return table.with_overrides(overrides) if overrides else table
