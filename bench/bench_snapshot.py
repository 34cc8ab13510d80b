"""The projection snapshot against the number of usage reports folded into it.

The daemon saves the fold (``tillerman.ledger.projections``) beside the ledger and
encodes it again at every heartbeat, so what the budget fold keeps to count each
response once (``Projection.usage_dedup``) is paid for at every heartbeat. Generated
Claude Code responses, each reported twice (a transcript writes one line per content
block), one turn of 20 responses every 10 minutes of source time, are folded into a
fresh projection; the row gives the snapshot's size and its encode time after N and
after 10 × N responses. The baseline is the same fold after N: a size that does not
grow with the responses' count stays near 1×.

Also reported: the fold's cost per usage event against a ``turn_started`` fold of the
same count (the fold without usage), in the same run.
"""

from __future__ import annotations

import statistics
import time

import msgspec

from bench.common import Row
from tillerman.ledger import events as ev
from tillerman.ledger.projections import Projection
from tillerman.ledger.usage import Tokens

START = 1_780_000_000.0  # a fixed source time: the fold reads only the envelopes' times
PER_TURN = 20
TURN_SECONDS = 600.0


def envelopes(responses: int) -> list[ev.Envelope]:
    """``responses`` Claude responses, each reported twice, in turns of ``PER_TURN``."""
    out = []
    for n in range(responses):
        turn, at = n // PER_TURN, START + (n // PER_TURN) * TURN_SECONDS + n % PER_TURN
        event = ev.Usage(thread_id="7f3c2a10-0000-4000-8000-000000000001", turn_id=f"turn-{turn:08d}",
                         source_kind="claude_transcript", model="claude-sonnet-4-5-20250929",
                         message_id=f"msg_01{n:024d}", request_id=f"req_01{n:024d}",
                         tokens=Tokens(input=1200 + n % 97, cached_input=1000, output=40 + n % 13))
        for copy in range(2):
            out.append(ev.Envelope(event_id=f"u{n}:{copy}", event=event, source="claude:x", at=at + copy * 0.001))
    return out


def fold(envs: list[ev.Envelope]) -> tuple[Projection, float]:
    projection = Projection()
    start = time.perf_counter()
    for seq, env in enumerate(envs, 1):
        projection.apply_envelope(env, seq)
    return projection, time.perf_counter() - start


def encode_seconds(projection: Projection, repeats: int) -> tuple[int, float]:
    encoder = msgspec.msgpack.Encoder()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        size = len(encoder.encode(projection))
        times.append(time.perf_counter() - start)
    return size, statistics.median(times)


def without_usage(count: int) -> float:
    """The fold's time for ``count`` events that are not usage (turn starts of one thread)."""
    envs = [ev.Envelope(event_id=f"s{n}", source="claude:x", at=START + n,
                        event=ev.TurnStarted(thread_id="7f3c2a10-0000-4000-8000-000000000001", turn_id=f"t{n}"))
            for n in range(count)]
    return fold(envs)[1]


def run(quick: bool) -> list[Row]:
    small = 500 if quick else 5_000
    rows = []
    (few, _), (many, many_s) = fold(envelopes(small)), fold(envelopes(small * 10))
    few_size, few_encode = encode_seconds(few, 5)
    many_size, many_encode = encode_seconds(many, 5)
    events = small * 10 * 2
    plain_s = without_usage(events)
    rows.append(Row(f"projection snapshot after {small * 10:,} responses (×2 reports)",
                    f"{many_size / 1e6:.2f} MB, encode {many_encode * 1e3:.2f} ms",
                    f"{few_size / 1e6:.2f} MB, encode {few_encode * 1e3:.2f} ms after {small:,}",
                    round(many_size / few_size, 2),
                    detail={"responses": [small, small * 10], "bytes": [few_size, many_size],
                            "encode_s": [few_encode, many_encode]}))
    rows.append(Row("fold per usage event vs per turn_started event", f"{many_s / events * 1e6:.1f} µs/event",
                    f"{plain_s / events * 1e6:.1f} µs/event", round(many_s / plain_s, 2),
                    detail={"events": events, "usage_s": many_s, "turn_started_s": plain_s}))
    return rows


if __name__ == "__main__":
    for row in run(quick=False):
        print(row.benchmark, "|", row.measured, "|", row.baseline, "|", row.ratio)
