"""``tillerman dashboard --ledger postgresql://…``: the page served from a PostgreSQL
ledger, its live updates woken by LISTEN/NOTIFY (no file to watch), and its actions
written to the database — the refused ones writing nothing."""

from __future__ import annotations

import pytest

from tests.controller.dashboard.served import next_change, serving, started
from tillerman.controller.dashboard.guard import CSRF_HEADER
from tillerman.ledger import events as ev
from tillerman.ledger.postgres import PostgresRecorder


@pytest.fixture
def ledger(postgres_dsn):
    """A database ledger holding one thread; the dashboard reads it on a connection of its own."""
    with PostgresRecorder(postgres_dsn) as writer:
        writer.append([started("thread-pg")])
    return postgres_dsn


def test_the_fleet_is_served_from_the_database(ledger, tmp_path):
    with serving(ledger, tmp_path) as served:
        fleet = served.client.get(str(served.page))
        assert fleet.status_code == 200 and "thread-pg" in fleet.text
        thread = served.client.get(str(served.page.join("thread/thread-pg")))
        assert thread.status_code == 200 and "thread-pg" in thread.text


def test_a_commit_from_another_connection_reaches_the_stream(ledger, tmp_path):
    with PostgresRecorder(ledger) as writer, serving(ledger, tmp_path) as served, \
            served.client.stream("GET", str(served.page.join("events"))) as events:
        lines = events.iter_lines()
        assert (next(lines), next(lines)) == ("event: hello", "id: 1")
        writer.append([started("thread-new", 1)])
        assert next_change(lines) == 2


def test_an_action_is_written_to_the_database(ledger, tmp_path):
    with serving(ledger, tmp_path) as served:
        response = served.post("queue", {"thread": "thread-pg", "text": "then run the tests"}, served.headers())
        assert response.status_code == 200 and "Done:" in response.text, response.text
    with PostgresRecorder(ledger, readonly=True) as reader:
        proposed = [e.envelope.event for e in reader.read(after_seq=1)]
    assert [(type(e), e.intent.thread_id, e.intent.text) for e in proposed] == [
        (ev.IntentProposed, "thread-pg", "then run the tests")]


@pytest.mark.parametrize(("spoil", "why"), [
    ({"origin": "http://evil.example"}, "cross-origin"),
    ({CSRF_HEADER: "forged"}, "CSRF"),
])
def test_a_refused_action_writes_nothing_to_the_database(ledger, tmp_path, spoil, why):
    with serving(ledger, tmp_path) as served:
        response = served.post("queue", {"thread": "thread-pg", "text": "then run the tests"},
                               {**served.headers(), **spoil})
        assert response.status_code == 403 and why in response.text
    with PostgresRecorder(ledger, readonly=True) as reader:
        assert reader.max_seq() == 1
