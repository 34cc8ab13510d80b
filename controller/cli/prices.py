"""``tillerman prices …``: the price table costs are computed with (``tillerman.rules.prices``).

``import`` replaces it from a LiteLLM price file the user supplies (tillerman never
fetches one: the machine may be offline); ``show`` prints the table's date, source and
digest, or what one model is priced at. Exit codes: 0 done, 2 usage, an unreadable or
bad price file, or an invalid config file.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import click
import msgspec

from tillerman.controller.cli.output import Fail, PathType, errors_to_exit_codes, json_option, print_json, print_line
from tillerman.controller.cli.shared import warn_unsafe
from tillerman.ledger.errors import UnsafeOutput
from tillerman.ledger.paths import check_output, replace_file
from tillerman.rules.errors import RuleSetError
from tillerman.rules.prices import (
    PriceFileError,
    PriceTable,
    effective_rates,
    imported_table_path,
    is_claude,
    load_prices,
    read_json,
)

PER_MILLION = 1_000_000
PRICES_CONFIG_HELP = "Configuration file whose [prices.\"MODEL\"] tables override the table (default:" \
                     " $XDG_CONFIG_HOME/tillerman/config.toml if it exists)."


@click.group()
def prices() -> None:
    """The dated price table that turns tokens into USD: show it, or replace it
    from a LiteLLM price file."""


@prices.command("import")
@click.argument("file", type=PathType(dir_okay=False, exists=True))
@click.option("--date", "taken", metavar="YYYY-MM-DD",
              help="When FILE was taken from its source (default: today, UTC); every cost records it.")
@click.option("--source", help="Where FILE came from, kept with the table (default: FILE's absolute path).")
@json_option
@errors_to_exit_codes
def import_cmd(file: str, taken: str | None, source: str | None, as_json: bool) -> None:
    """Replace the price table with one trimmed from FILE, LiteLLM's full
    model_prices_and_context_window.json (from the BerriAI/litellm repository, or
    litellm/model_prices_and_context_window_backup.json inside the litellm wheel).

    Claude and OpenAI models are kept, as ccusage keeps them, with their per-token
    rates, long-context tiers, context windows and fast-mode factors. A figure that
    is not a number, negative, NaN or above $1 a token refuses the whole file with
    the model and field named (exit 2), and the table in use stays. The table is
    stored in $XDG_DATA_HOME/tillerman/prices.json, replaced atomically. --json
    prints what was stored: the models kept, the date, source and digest, and the path.

    Example: tillerman prices import model_prices_and_context_window.json --date 2026-12-01
    """
    date = _date(taken)
    try:
        raw, data = read_json(file)
        from tillerman.rules.prices_trim import encode, table_document

        document = table_document(raw, data, date=date, source=source or os.path.abspath(file))
    except PriceFileError as exc:
        raise Fail(f"cannot import {file}: {exc}; the price table in use is unchanged") from None
    target = imported_table_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        path = check_output(target, "the price table")
        replace_file(path, lambda temporary: temporary.write_text(encode(document), encoding="utf-8"), mode=0o644)
    except (UnsafeOutput, OSError) as exc:
        raise Fail(f"cannot store the price table: {exc}") from None
    if as_json:
        print_json({"models": len(document["models"]), "date": date, "source": document["source"],
                    "digest": document["digest"], "path": str(target)})
        return
    print_line(f"Imported prices for {len(document['models'])} models, dated {date}, from {file}"
               f" ({document['digest']}); stored in {target}")


@prices.command("show")
@click.argument("model", required=False)
@click.option("--config", "config_path", type=PathType(dir_okay=False, exists=True), help=PRICES_CONFIG_HELP)
@json_option
@errors_to_exit_codes
def show_cmd(model: str | None, config_path: str | None, as_json: bool) -> None:
    """Print the price table's date, source and digest; with MODEL, the table key
    that prices it (matched as ccusage matches names), its rates in USD per
    million tokens, long-context tiers, context window and fast factor — or that
    it has no price (its costs are then null, never 0).

    Example: tillerman prices show claude-sonnet-4-5-20250929 --json
    """
    table = price_table(config_path)
    summary = {"date": table.date, "source": table.source, "digest": table.digest, "models": len(table.models),
               "from": str(imported_table_path()) if imported_table_path().exists() else "bundled"}
    if model is None:
        if as_json:
            print_json(summary)
        else:
            for key, value in summary.items():
                print_line(f"{key}: {value}")
        return
    entry = model_entry(table, model)
    if as_json:
        print_json({"table": summary, **entry})
        return
    if entry["key"] is None:
        print_line(f"{model}: no price in the table dated {table.date} (costs are null, reason no_price)")
        return
    print_line(f"{model}: priced as {entry['key']} (table dated {table.date}), USD per million tokens")
    for tier in entry["tiers"]:
        above = "" if tier["above"] == 0 else f" (input above {tier['above']:,} tokens)"
        rates = ", ".join(f"{name} {value:g}" for name, value in tier["per_million"].items())
        print_line(f"  {rates}{above}")
    print_line(f"  context window: {entry['context_window'] or 'unknown'}; fast factor: {entry['fast'] or 'none'}")


def model_entry(table: PriceTable, model: str) -> dict:
    """What ``show MODEL`` prints: the matched key and, for the base and each tier,
    every rate as it applies (derived ones filled in), per million tokens."""
    key = table.match(model)
    if key is None:
        return {"model": model, "key": None, "missing": "no_price"}
    price = table.models[key]
    tiers = []
    for above in [0, *(tier.above for tier in price.tiers)]:
        # the rates of a response one token past the threshold: the tier's own
        rates = effective_rates(price, above + 1 if above else 0, claude=is_claude(key))
        tiers.append({"above": above, "per_million": {name: round(value * PER_MILLION, 9)
                                                      for name, value in msgspec.structs.asdict(rates).items()}})
    return {"model": model, "key": key, "tiers": tiers, "context_window": table.context_window(model),
            "fast": price.fast}


def price_table(config_path: str | None) -> PriceTable:
    """The price table in force with the config file's ``[prices."MODEL"]`` overrides, as
    every command that prices usage reads it; a spoiled one is one line, exit 2."""
    from tillerman.rules.config import config_file
    from tillerman.rules.file_safety import read_file

    overrides = {}
    path = config_file(config_path)
    try:
        if path is not None:
            # imported only for a config file to read: it brings pydantic (~0.08 s of every usage report)
            from tillerman.rules.price_config import load_price_overrides

            overrides = load_price_overrides(read_file(Path(path), on_unsafe=warn_unsafe), str(path))
        return load_prices(overrides)
    except (RuleSetError, PriceFileError) as exc:
        raise Fail(str(exc)) from None


def _date(taken: str | None) -> str:
    if taken is None:
        return datetime.datetime.now(datetime.UTC).date().isoformat()
    try:
        return datetime.date.fromisoformat(taken).isoformat() if len(taken) == 10 else _bad_date(taken)
    except ValueError:
        return _bad_date(taken)


def _bad_date(taken: str) -> str:
    raise Fail(f"--date {taken!r} is not a date; write it as YYYY-MM-DD, e.g. 2026-12-01")
