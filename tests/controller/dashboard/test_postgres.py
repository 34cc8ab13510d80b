"""``tillerman dashboard --ledger postgresql://…``: the page served from a PostgreSQL
ledger, its live updates woken by LISTEN/NOTIFY (no file to watch), and its actions
written to the database — the refused ones writing nothing."""

from __future__ import annotations

import json

import anyio
import pytest

from tests.controller.dashboard.served import next_change, serving, started
from tillerman.controller.dashboard.guard import CSRF_HEADER
from tillerman.controller.dashboard.live import Live
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


def test_started_it_listens_and_reads_what_was_committed_before(ledger):
    """``Live.run`` started (as the server's lifespan starts it) has its LISTEN in place:
    a commit right after is announced, with no wait for the feed. A commit made after the
    projection was loaded and before the LISTEN is announced as well, unasked."""
    with PostgresRecorder(ledger) as reader, PostgresRecorder(ledger) as writer:
        live = Live(reader, coalesce=0.01)
        writer.append([started("before", 1)])

        async def scenario() -> list[dict]:
            stream = live.events(keepalive=0)
            assert (await anext(stream)).startswith("event: hello\nid: 1\n")
            async with anyio.create_task_group() as tg:
                await tg.start(live.run)
                with anyio.fail_after(30):
                    changes = [await anext(stream)]
                    writer.append([started("after", 2)])
                    changes.append(await anext(stream))
                await stream.aclose()
                tg.cancel_scope.cancel()
            return [json.loads(change.split("data: ", 1)[1]) for change in changes]

        assert anyio.run(scenario) == [{"seq": 2, "threads": ["before"], "intents": []},
                                       {"seq": 3, "threads": ["after"], "intents": []}]


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
