"""The dashboard's live feed: a commit by another connection reaches the open pages as
one SSE message naming the thread and the seq, folded into the projection without a
refold; and the command serving it, end to end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import uvicorn
from click.testing import CliRunner

from tests.controller.dashboard.served import PATIENCE, next_change, serving, started
from tillerman.controller.cli.main import main
from tillerman.controller.dashboard import secret as secrets_file
from tillerman.controller.dashboard.live import SUBSCRIBER_BUFFER, Change, Live
from tillerman.ledger import events as ev
from tillerman.ledger.backends import open_recorder
from tillerman.ledger.events import Envelope


class CountingFold:
    def __init__(self) -> None:
        self.seqs: list[int] = []

    def apply(self, entry) -> None:
        self.seqs.append(entry.seq)


def test_a_commit_from_another_connection_reaches_the_stream(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    reader, writer = open_recorder(path), open_recorder(path)
    writer.append([started("old")])
    fold = CountingFold()
    live = Live(reader, folds=(fold,), coalesce=0.01)
    assert fold.seqs == [1] and live.seq == 1

    async def scenario() -> list[str]:
        got: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(live.run)
            stream = live.events(keepalive=0)
            got.append(await anext(stream))  # hello, at the seq it starts from
            await anyio.sleep(0.3)  # the watcher is watching
            writer.append([started("new", 1)])
            with anyio.fail_after(10):
                got.append(await anext(stream))
            await stream.aclose()
            tg.cancel_scope.cancel()
        return got

    hello, change = anyio.run(scenario)
    assert hello.startswith("event: hello\nid: 1\n")
    assert change.startswith("event: change\nid: 2\n")
    data = json.loads(change.split("data: ", 1)[1])
    assert data == {"seq": 2, "threads": ["new"], "intents": []}
    assert fold.seqs == [1, 2]  # the new row only: no refold
    assert "new" in live.projection.threads
    reader.close()
    writer.close()


def labeled(thread_id: str, n: int) -> Envelope:
    return Envelope(event_id=f"label:{n}", event=ev.OwnerLabeled(subject="intent:x", verdict="useful", by="ann",
                                                                 thread=thread_id),
                    source="cli", at=1_700_000_000.0 + n)


def test_a_change_folded_by_a_page_is_still_sent_and_a_label_names_its_thread(tmp_path):
    """A page's refresh folds the rows before the publisher wakes: it must send them anyway."""
    path = tmp_path / "ledger.sqlite3"
    reader, writer = open_recorder(path), open_recorder(path)
    writer.append([started("old")])
    live = Live(reader, coalesce=0.01)

    async def scenario() -> str:
        async with anyio.create_task_group() as tg:
            tg.start_soon(live.run)
            stream = live.events(keepalive=0)
            await anext(stream)
            await anyio.sleep(0.3)
            writer.append([started("new", 1), labeled("old", 2)])
            live.refresh()  # a page rendered (or an action posted) first
            with anyio.fail_after(10):
                change = await anext(stream)
            await stream.aclose()
            tg.cancel_scope.cancel()
        return change

    data = json.loads(anyio.run(scenario).split("data: ", 1)[1])
    assert data == {"seq": 3, "threads": ["new", "old"], "intents": []}
    reader.close()
    writer.close()


def test_a_page_that_falls_behind_is_cut_off_to_reconnect_not_thinned(tmp_path):
    """Past SUBSCRIBER_BUFFER unread messages a page's stream ends (the browser reconnects,
    and the new hello makes it fetch everything) instead of losing the threads named in the
    messages it could not take."""
    path = tmp_path / "ledger.sqlite3"
    reader = open_recorder(path)
    live = Live(reader, coalesce=0.01)

    async def scenario() -> list[str]:
        stream = live.events(keepalive=0)
        got = [await anext(stream)]  # hello
        for seq in range(1, SUBSCRIBER_BUFFER + 2):
            live._send(Change(seq=seq, threads=(f"t{seq}",)))
        with anyio.fail_after(10):
            got.extend([message async for message in stream])
        return got

    got = anyio.run(scenario)
    assert got[0].startswith("event: hello")
    assert [m.split("\n")[1] for m in got[1:]] == [f"id: {seq}" for seq in range(1, SUBSCRIBER_BUFFER + 1)]
    assert not live._pages  # ended, and forgotten
    reader.close()


def test_non_loopback_host_needs_allow_remote(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output and "ssh -L" in result.output and len(result.output.splitlines()) == 1


def test_an_unspecified_address_needs_a_name(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--host", "0.0.0.0", "--allow-remote"])
    assert result.exit_code == 2 and "--name" in result.output and len(result.output.splitlines()) == 1


def test_port_80_is_refused(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--port", "80"])
    assert result.exit_code == 2 and "Host" in result.output and len(result.output.splitlines()) == 1


def test_one_url_per_name_and_a_warning_that_the_page_is_plain_http(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    proc = subprocess.Popen([sys.executable, "-c", "from tillerman.controller.cli.main import main; main()",
                             "dashboard", "--ledger", str(path), "--port", "0", "--allow-remote",
                             "--name", "box.example", "--name", "box.tail.example"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        urls = [proc.stdout.readline() for _ in range(3)]
        warning = proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    assert [u.split("://", 1)[1].split(":", 1)[0] for u in urls] == ["127.0.0.1", "box.example", "box.tail.example"]
    assert all(u.startswith("tillerman dashboard: http://") and "/d/" in u and "?token=" in u for u in urls)
    assert "plain HTTP" in warning and "SSH tunnel" in warning


def test_a_secret_file_others_may_read_is_refused(tmp_path):
    path, secret = tmp_path / "ledger.sqlite3", tmp_path / "secret"
    open_recorder(path).close()
    secret.write_bytes(secrets_file.MARK + b"x\n")
    secret.chmod(0o644)
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--secret-file", str(secret)])
    assert result.exit_code != 0 and "chmod 600" in result.output and len(result.output.splitlines()) == 1


def test_the_secret_persists_until_rotated(tmp_path):
    path = tmp_path / "dir" / "secret"
    first = secrets_file.load(path)
    assert path.stat().st_mode & 0o777 == 0o600 and secrets_file.load(path) == first
    assert secrets_file.load(path, rotate=True) != first


@pytest.mark.parametrize("what", ["a person's file", "the ledger", "a device"])  # a folder: click refuses it
@pytest.mark.parametrize("rotate", [False, True])
def test_a_secret_file_that_is_not_ours_is_refused_and_left_as_it_is(tmp_path, what, rotate):
    """--secret-file pointed at anything but a secret tillerman wrote is neither read as a
    secret nor replaced by one (--new-secret): a person's notes, the ledger, /dev/null."""
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    notes.chmod(0o600)
    target = {"a person's file": notes, "the ledger": path, "a device": Path("/dev/null")}[what]
    os.chmod(path, 0o600)  # readable by others, the ledger would be refused for that first
    before = target.read_bytes() if target.is_file() else None
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--secret-file", str(target),
                                       *(["--new-secret"] if rotate else [])])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert (target.read_bytes() if target.is_file() else None) == before
    assert Path("/dev/null").is_char_device()


def test_a_symlinked_secret_file_is_written_through(tmp_path):
    real, link = tmp_path / "real-secret", tmp_path / "link"
    first = secrets_file.load(real)
    link.symlink_to(real)
    assert secrets_file.load(link) == first
    second = secrets_file.load(link, rotate=True)
    assert link.is_symlink() and secrets_file.load(real) == second != first
    assert real.stat().st_mode & 0o777 == 0o600


def test_the_command_serves_live_events_and_ctrl_c_with_the_page_open_ends_both(tmp_path):
    """A page's event stream never ends by itself, and uvicorn waits for open requests
    before it stops: Ctrl-C with a tab open held the server up until the tab closed."""
    path = tmp_path / "ledger.sqlite3"
    with open_recorder(path) as writer:
        writer.append([started("old")])
        with serving(str(path), tmp_path) as served, \
                served.client.stream("GET", str(served.page.join("events"))) as events:
            lines = events.iter_lines()
            assert next(lines) == "event: hello"
            writer.append([started("new", 1)])
            assert next_change(lines) == 2
            served.process.send_signal(signal.SIGINT)
            assert served.process.wait(timeout=PATIENCE) == 0  # the stream open: ended, not waited for
            assert [line for line in lines if line.startswith("event:")] == []  # it ended, nothing more sent


def test_a_stream_ends_once_the_server_is_stopping_and_one_opened_then_ends_at_once(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    reader = open_recorder(path)
    live = Live(reader, coalesce=0.01)

    async def scenario() -> tuple[list[str], list[str]]:
        stream = live.events(keepalive=0)
        first = [await anext(stream)]
        live.end_streams()
        with anyio.fail_after(10):
            first.extend([message async for message in stream])
            late = [message async for message in live.events(keepalive=0)]
        return first, late

    first, late = anyio.run(scenario)
    assert [m.split("\n")[0] for m in first] == ["event: hello"]
    assert [m.split("\n")[0] for m in late] == ["event: hello"]
    assert not live._pages
    reader.close()


def test_the_printed_url_is_listening_before_the_server_starts(tmp_path, monkeypatch):
    """A client that opens the URL as soon as it is printed waits in the backlog while
    uvicorn starts (the lifespan, the change feed's connection), instead of being refused."""
    path = tmp_path / "ledger.sqlite3"
    open_recorder(path).close()
    listening = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: listening.extend(
        s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) for s in sockets))
    result = CliRunner().invoke(main, ["dashboard", "--ledger", str(path), "--port", "0",
                                       "--secret-file", str(tmp_path / "secret")])
    assert result.exit_code == 0 and "tillerman dashboard: http://" in result.output, result.output
    assert listening == [1]
