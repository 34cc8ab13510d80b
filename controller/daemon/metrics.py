"""``tillerman run --metrics HOST:PORT``: the daemon's counters for Prometheus.

Everything counted comes from what the brain folds (``fold``) or finds each round
(``round``): ledger rows by source, decisions by action, intents by state (kept up to
date by the transitions folded), overdue intents, notification attempts and failures,
reviewer calls. Ledger append latency is timed around every append the daemon makes
(its brain, its delivery tasks, its notification sinks) by ``TimedRecorder``. The
server is prometheus-client's own, in a thread of its own, on its own registry.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.projections import Projection
from tillerman.ledger.recorder import AppendResult, Recorder
from tillerman.rules.notify import is_loopback

#: Appends are single SQLite transactions: most take well under a millisecond.
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    def __init__(self) -> None:
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
