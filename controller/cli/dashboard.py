"""``tillerman dashboard``: the fleet on a local web page (``tillerman.controller.dashboard``).

Binds 127.0.0.1 unless told otherwise; another address needs ``--allow-remote``, and even
then the docs' advice holds (an SSH tunnel or a private network, never plain HTTP on a
public interface). Prints the URL with the secret, as Jupyter does (the secret is kept
in a 0600 file, so the URL outlives a restart); Ctrl-C ends it.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import click

from tillerman.controller.cli.output import Fail, errors_to_exit_codes, json_option, print_json, print_line
from tillerman.controller.cli.prices import price_table
from tillerman.controller.cli.shared import ledger_file, ledger_option, ledger_url, open_ledger

from tillerman.controller.dashboard import secret as secrets_file
from tillerman.controller.dashboard.guard import login_url
from tillerman.ledger.errors import UnsafeOutput
from tillerman.ledger.location import shown
from tillerman.rules.notify import is_loopback
from tillerman.rules.owner import local_login

DEFAULT_PORT = 8765
#: Seconds the server waits, once told to stop, for open requests (a page's event stream
#: never ends by itself) before it cuts them.
SHUTDOWN_GRACE = 1
SAFE_WAY = ("reach a remote machine's dashboard through an SSH tunnel (ssh -L 8765:127.0.0.1:8765 HOST)"
            " or a private network (WireGuard, Tailscale), never plain HTTP on a public interface")


@click.command("dashboard")
@ledger_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; one that is not loopback needs --allow-remote.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on (0: any free port; the URL printed says which).")
@click.option("--allow-remote", is_flag=True,
              help="Listen on a non-loopback --host. The page is plain HTTP: use it on a private network only.")
@click.option("--name", "names", multiple=True,
              help="With --allow-remote: another name the page is reached by (a Tailscale name), accepted as Host;"
                   " required with an unspecified --host (0.0.0.0, ::).")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The file keeping the page's secret, created when absent (mode 0600)"
                   " [default: $XDG_STATE_HOME/tillerman/dashboard-secret].")
@click.option("--new-secret", is_flag=True,
              help="Write a new secret first: the URLs printed before (bookmarks, browser history) stop working.")
@click.option("--owner", default=local_login,
              help="Who the page's actions are proposed as (default: the login name of the user running tillerman).")
@json_option
@errors_to_exit_codes
def dashboard(ledger_path, host, port, allow_remote, names, secret_file, new_secret, owner, as_json):
    """Serve every session on one live local web page, with the owner's actions on it.

    Prints the URL to open: it carries the secret and is a password (it stays in the
    browser's history; --new-secret makes a new one). The page reads
    the ledger and writes to it as `tillerman intent propose` does: a running daemon
    delivers what the page proposes.

    Example: tillerman dashboard --ledger ledger.sqlite3
    """
    from tillerman.controller.dashboard.app import make_app

    if not is_loopback(host) and not allow_remote:
        raise Fail(f"--host {host} is not a loopback address; add --allow-remote to listen there, or {SAFE_WAY}")
    if names and not allow_remote:
        raise Fail("--name is for --allow-remote; a loopback dashboard answers to 127.0.0.1 and localhost")
    unspecified = host.strip("[]") in ("0.0.0.0", "::")
    if unspecified and not names:
        raise Fail(f"--host {host} listens on every interface but is no address a browser can open;"
                   " add --name NAME for each name the page is reached by (a private address, a Tailscale name)")
    if port == 80:
        raise Fail("--port 80 does not work (browsers leave :80 out of Host, which the page checks); give another --port")
    try:
        secret = secrets_file.load(secret_file or secrets_file.default_path(), rotate=new_secret,
                                   ledgers=() if ledger_url(ledger_path) else (ledger_file(ledger_path),))
    except (OSError, secrets_file.SecretFileError, UnsafeOutput) as exc:
        raise Fail(str(exc)) from None
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        # listening before the URL is printed: a client that opens it at once waits in the
        # backlog while the server starts, instead of being refused
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise Fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}); give another --port, or 0 for any free one") from None
    port = sock.getsockname()[1]  # the one bound, when --port 0
    url_given = ledger_url(ledger_path)
    where = shown(url_given) if url_given else str(ledger_file(ledger_path))
    with open_ledger(ledger_path, must_exist=True) as ledger:
        app = make_app(ledger, secret=secret, host=host.strip("[]"), port=port, remote_names=names, owner=owner,
                       prices=price_table(None))
        urls = [login_url(name, port, secret) for name in ((() if unspecified else (host.strip("[]"),)) + names)]
        if as_json:
            print_json({"url": urls[0], "urls": urls, "ledger": where, "owner": owner})
        else:
            for url in urls:
                print_line(f"tillerman dashboard: {url}")
            print_line(f"ledger: {where}; actions proposed as {owner}; Ctrl-C stops")
        if allow_remote:
            print_line(f"the page is plain HTTP: {SAFE_WAY}", err=True)
        server = _server(app)
        # uvicorn shuts down on SIGINT/SIGTERM, then raises the signal again: Ctrl-C comes
        # back as KeyboardInterrupt, the end asked for
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])


def _server(app):
    """uvicorn's server for the dashboard ``app``: told to stop (Ctrl-C, SIGTERM), it ends
    every page's event stream at once (uvicorn waits for open requests before it stops,
    and a stream never ends by itself: a tab left open held the server up), and cuts
    what is still open after ``SHUTDOWN_GRACE`` seconds."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            with contextlib.suppress(RuntimeError):  # no loop running yet: no stream open
                asyncio.get_running_loop().call_soon_threadsafe(app.end_streams)
            super().handle_exit(sig, frame)

    return Server(uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                                 timeout_graceful_shutdown=SHUTDOWN_GRACE))
