"""A tillerman price table from LiteLLM's full ``model_prices_and_context_window.json``.

Trimmed as ccusage's build trims it (``build.rs`` ``compact_pricing_json``,
``is_embedded_model``): the entries of Claude and OpenAI models under the names the
agents and their gateways use, and of each only what pricing a response reads — the
per-token rates with their long-context (``_above_<N>k_tokens``) and 1-hour-write
variants, ``max_input_tokens``, and the fast-mode factor. Every kept figure is checked
(``tillerman.rules.prices``): a bad one is an error naming model and field, so a file
with nonsense in it is refused whole rather than priced in part.

``tillerman prices import`` uses this; so does the bundled table::

    python -m tillerman.rules.prices_trim model_prices_and_context_window_backup.json \\
        --date 2026-12-06 --source "litellm 1.110.2 (PyPI wheel)" > rules/prices.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from tillerman.rules.prices import (
    CONTEXT_FIELD,
    FAST_FIELD,
    FAST_HOLDER,
    RATE_FIELDS,
    TIER_SUFFIX,
    PriceFileError,
    model_price,
    read_json,
)

#: ccusage's list: Anthropic's ids (direct, Bedrock's regional ones), OpenAI's, and the
#: gateways that serve OpenAI models under a prefix.
KEPT_PREFIXES = ("claude-", "anthropic.", "anthropic/", "us.anthropic.", "eu.anthropic.", "global.anthropic.",
                 "jp.anthropic.", "au.anthropic.", "gpt-", "openai/", "azure/", "openrouter/openai/")


def kept_field(field: str) -> bool:
    match = TIER_SUFFIX.search(field)
    return (field[: match.start()] if match else field) in RATE_FIELDS.values() or field == CONTEXT_FIELD


def trim(data: Any) -> dict[str, dict[str, Any]]:
    """The kept models of a LiteLLM price file, each with its kept fields, in name
    order; ``PriceFileError`` for a bad figure or a file with nothing to price."""
    if not isinstance(data, Mapping):
        raise PriceFileError("not a LiteLLM price file (the top level is not an object of models)")
    kept: dict[str, dict[str, Any]] = {}
    for model in sorted(name for name in data if isinstance(name, str) and name.startswith(KEPT_PREFIXES)):
        entry = data[model]
        if not isinstance(entry, Mapping):
            raise PriceFileError(f'model "{model}": not an object of prices')
        fields = {field: value for field, value in entry.items() if isinstance(field, str) and kept_field(field)}
        holder = entry.get(FAST_HOLDER)
        if isinstance(holder, Mapping) and FAST_FIELD in holder:
            fields[FAST_HOLDER] = {FAST_FIELD: holder[FAST_FIELD]}
        elif holder is not None and not isinstance(holder, Mapping):
            fields[FAST_HOLDER] = holder  # refused by model_price, with its name
        if model_price(model, fields) is not None:
            kept[model] = dict(sorted(fields.items()))
    if not kept:
        raise PriceFileError("no Claude or OpenAI model with an input and an output price in it"
                             " (is it LiteLLM's model_prices_and_context_window.json?)")
    return kept


def table_document(raw: bytes, data: Any, *, date: str, source: str) -> dict[str, Any]:
    """The stored table: when and from what it was taken, the source file's digest,
    and the trimmed models."""
    return {"date": date, "source": source, "digest": "sha256:" + hashlib.sha256(raw).hexdigest(),
            "models": trim(data)}


def encode(document: Mapping[str, Any]) -> str:
    """One entry a line, so a refreshed table's diff shows what changed."""
    models = ",\n".join(f"  {json.dumps(model)}: {json.dumps(entry, sort_keys=True)}"
                        for model, entry in document["models"].items())
    head = {key: value for key, value in document.items() if key != "models"}
    return json.dumps(head, indent=1)[:-2] + ',\n "models": {\n' + models + "\n }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Trim LiteLLM's price file into a tillerman price table.")
    parser.add_argument("file", help="LiteLLM's model_prices_and_context_window.json")
    parser.add_argument("--date", required=True, help="when the file was taken (YYYY-MM-DD)")
    parser.add_argument("--source", required=True, help="where it was taken from")
    args = parser.parse_args(argv)
    try:
        document = table_document(*read_json(args.file), date=args.date, source=args.source)
    except PriceFileError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(encode(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
