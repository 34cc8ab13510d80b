"""``tillerman run --metrics HOST:PORT``: the daemon's counters for Prometheus.

Everything counted comes from what the brain folds (``fold``) or finds each round
(``round``): ledger rows by source, decisions by action, intents by state (kept up to
date by the transitions folded), overdue intents, notification attempts and failures,
reviewer calls, and the agents' usage: tokens by kind and cost per thread and model,
counted once and priced response by response as ``tillerman usage`` does (a duplicate
that replaces one counted before moves the figures back, so they are gauges). Thread and
model labels are bounded: the first ``MAX_THREAD_LABELS`` threads and
``MAX_MODEL_LABELS`` models seen get labels of their own, the rest are counted under
``other``. Ledger append latency is timed around every append the daemon makes
(its brain, its delivery tasks, its notification sinks) by ``TimedRecorder``. The
server is prometheus-client's own, in a thread of its own, on its own registry.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tillerman.controller.report.usage import UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.ledger.recorder import AppendResult, Recorder
from tillerman.ledger.usage import Tokens
from tillerman.ledger.usage_account import Place
from tillerman.rules.notify import is_loopback
from tillerman.rules.prices import Cost, PriceTable, bundled_table

#: Appends are single SQLite transactions: most take well under a millisecond.
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Label bounds: at most MAX_THREAD_LABELS + 1 threads × MAX_MODEL_LABELS + 1 models, each
#: with one series per token kind, one of cost and one of unpriced responses.
MAX_THREAD_LABELS = 100
MAX_MODEL_LABELS = 20
OTHER = "other"
TOKEN_KINDS = ("input", "cached_input", "cache_write", "output", "reasoning")


class Metrics:
    def __init__(self, prices: PriceTable | None = None) -> None:
        self.registry = registry = CollectorRegistry()
        self.events = Counter("tillerman_events_ingested", "Ledger rows the daemon folded, by kind of source",
                              ["source"], registry=registry)
        self.decisions = Counter("tillerman_decisions", "Decisions recorded, by action", ["action"],
                                 registry=registry)
        self.intents = Gauge("tillerman_intents", "Intents by state", ["state"], registry=registry)
        self.overdue = Gauge("tillerman_overdue_intents", "Intents past a deadline now", registry=registry)
        self.notifications = Counter("tillerman_notifications_sent", "Notice groups a sink took, by sink",
                                     ["sink"], registry=registry)
        self.notification_failures = Counter("tillerman_notification_failures",
                                             "Failed attempts to hand notices to a sink, by sink", ["sink"],
                                             registry=registry)
        self.append_seconds = Histogram("tillerman_ledger_append_seconds", "Time to append one batch to the ledger",
                                        buckets=APPEND_BUCKETS, registry=registry)
        self.reviewer_calls = Counter("tillerman_reviewer_calls", "Reviewer calls committed, by outcome",
                                      ["outcome"], registry=registry)
        self.usage_tokens = Gauge("tillerman_usage_tokens", "Agent tokens counted, by thread, model and kind (cached"
                                  " input inside input, reasoning inside output)", ["thread", "model", "kind"],
                                  registry=registry)
        self.usage_cost = Gauge("tillerman_usage_cost_usd", "Agent cost of the priced responses, by thread and model",
                                ["thread", "model"], registry=registry)
        self.usage_unpriced = Gauge("tillerman_usage_unpriced_responses", "Responses with no price (their cost is"
                                    " not in tillerman_usage_cost_usd), by thread and model", ["thread", "model"],
                                    registry=registry)
        self.usage = UsageReport(prices or bundled_table(), by="session", on_count=self._usage_moved)
        self._labels: dict[str, dict[str | None, str]] = {"thread": {}, "model": {}}

    def start(self, projection: Projection) -> None:
        """The intents the daemon starts with (its fold, which ``fold`` then follows);
        every state is shown, at 0 when no intent is in it."""
        counts = collections.Counter(str(view.state) for view in projection.intents.values())
        for state in State:
            self.intents.labels(state.value).set(counts[state.value])

    def fold(self, entry: Entry) -> None:
        event = entry.envelope.event
        # the kind of source only: "file:/path/…" and "appserver:…" name one file or server
        # each, and a label per file would grow without bound
        self.events.labels(entry.envelope.source.partition(":")[0]).inc()
        match event:
            case ev.DecisionRecorded(shadow=False):
                self.decisions.labels(event.action).inc()
            case ev.IntentProposed():
                self.intents.labels("proposed").inc()
            case ev.IntentTransition():
                self.intents.labels(event.from_state).dec()
                self.intents.labels(event.to_state).inc()
            case ev.NotificationSent():
                self.notifications.labels(event.sink).inc()
            case ev.NotificationFailed():
                self.notification_failures.labels(event.sink).inc()
            case ev.ReviewCommitted():
                self.reviewer_calls.labels(event.outcome).inc()
            case ev.Usage() | ev.UsageReported():
                self.usage.add(entry.envelope)

    def _usage_moved(self, place: Place, tokens: Tokens, cost: Cost, sign: int) -> None:
        labels = (self._label("thread", place.thread_id, MAX_THREAD_LABELS),
                  self._label("model", place.model, MAX_MODEL_LABELS))
        for kind in TOKEN_KINDS:
            self.usage_tokens.labels(*labels, kind).inc(sign * getattr(tokens, kind))
        if cost.usd is None:
            self.usage_unpriced.labels(*labels).inc(sign)
        else:
            self.usage_cost.labels(*labels).inc(sign * cost.usd)

    def _label(self, dimension: str, name: str | None, bound: int) -> str:
        """``name``'s label, or ``other`` once ``bound`` names have labels of their own."""
        known = self._labels[dimension]
        if name not in known and len(known) < bound:
            known[name] = name or "unknown"
        return known.get(name, OTHER)

    def serve(self, address: tuple[str, int]) -> None:
        start_http_server(address[1], addr=address[0], registry=self.registry)


class TimedRecorder:
    """A recorder whose appends are timed into ``Metrics.append_seconds``; everything
    else is the recorder's own."""

    def __init__(self, recorder: Recorder, metrics: Metrics) -> None:
        self._recorder = recorder
        self._histogram = metrics.append_seconds

    def append(self, batch: Sequence[Envelope], **options) -> AppendResult:
        started = time.perf_counter()
        try:
            return self._recorder.append(batch, **options)
        finally:
            self._histogram.observe(time.perf_counter() - started)

    def __getattr__(self, name: str):
        return getattr(self._recorder, name)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) -> (host, port); ``ValueError`` saying how to write it.
    Only a loopback host: the metrics name threads' states and carry no authentication."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--metrics {text!r} is not HOST:PORT; write e.g. --metrics 127.0.0.1:9464")
    if not is_loopback(host):
        raise ValueError(f"--metrics {text!r} is not a loopback address; serve on 127.0.0.1 or ::1"
                         " and let a local collector or proxy expose it")
    return host, int(port)
