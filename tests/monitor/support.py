"""Shared helpers for the monitor tests: run a parser over bytes, list what came out."""

from __future__ import annotations

from pathlib import Path

from tillerman.ledger.events import Event, Quarantined, kind_of
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.parser import Parsed

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"


def parse(fmt: str, data: bytes, *, source: str = "test.jsonl", chunks: list[int] | None = None,
          **options) -> tuple[list[Parsed], object]:
    """All ``Parsed`` for ``data``, fed whole or cut at the given chunk sizes, and the parser."""
    parser = PARSERS[fmt](source, **options)
    out: list[Parsed] = []
    if chunks is None:
        out += parser.feed(data)
    else:
        start = 0
        for size in chunks:
            out += parser.feed(data[start:start + size])
            start += size
        out += parser.feed(data[start:])
    out += parser.close()
    return out, parser


def events(fmt: str, data: bytes, **options) -> list[Event]:
    return [p.event for p in parse(fmt, data, **options)[0]]


def kinds(evs: list[Event]) -> list[str]:
    return [kind_of(e) for e in evs]


def reasons(evs: list[Event]) -> list[str]:
    return [e.reason for e in evs if isinstance(e, Quarantined)]


def jsonl(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()
