"""``tillerman run --metrics HOST:PORT --log-format json`` as a person runs it: the real
command in its own process serves Prometheus metrics that move as it follows a session
file, and writes its log as one JSON object per line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
ROLLOUT = ROOT / "fixtures/sessions/codex-rollout/rollout-2025-09-02T10-00-00-0199a1b2-0000-7000-8000-00000000aa01.jsonl"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sample(text: str, name: str) -> float:
    """The sum of a metric's samples in the exposition text (0 when absent)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.read().decode()
    except OSError:
        return None


def test_metrics_move_and_the_log_is_json_lines(tmp_path):
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tillerman.controller", "run", "--no-codex", "--watch", str(sessions), "--ledger",
         str(tmp_path / "ledger.sqlite3"), "--metrics", f"127.0.0.1:{port}", "--log-format", "json", "-v"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    try:
        deadline = time.monotonic() + 30
        while (before := _scrape(url)) is None:
            assert daemon.poll() is None and time.monotonic() < deadline, "the metrics never came up"
            time.sleep(0.1)
        # no session file yet (the daemon's own rows, a heartbeat, may be counted already)
        assert _sample(before, 'tillerman_events_ingested_total{source="file"}') == 0
        shutil.copy(ROLLOUT, sessions / ROLLOUT.name)  # a session file appears: the daemon follows it
        while _sample(after := _scrape(url) or "", 'tillerman_events_ingested_total{source="file"}') == 0:
            assert time.monotonic() < deadline, "the counters never moved"
            time.sleep(0.1)
        assert _sample(after, "tillerman_ledger_append_seconds_count") >= 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    lines = [json.loads(line) for line in stderr.splitlines()]  # every line is one JSON object
    assert lines and {"time", "level", "logger", "message"} <= set(lines[-1])
    assert any(line["message"] == "received SIGTERM: stopping" and line["level"] == "info" for line in lines)


@pytest.mark.parametrize(("address", "message"), [
    ("9464", "--metrics '9464' is not HOST:PORT; write e.g. --metrics 127.0.0.1:9464"),
    ("0.0.0.0:9464", "--metrics '0.0.0.0:9464' is not a loopback address; serve on 127.0.0.1 or ::1"),
])
def test_a_wrong_metrics_address_is_one_line_and_exit_2(tmp_path, address, message):
    (tmp_path / "sessions").mkdir()
    result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(tmp_path / "sessions"), "--ledger",
                                       str(tmp_path / "ledger.sqlite3"), "--metrics", address])
    assert result.exit_code == 2 and result.output.startswith(f"Error: {message}")


def test_a_busy_metrics_port_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "sessions").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["run", "--no-codex", "--watch", str(tmp_path / "sessions"), "--ledger",
                                           str(tmp_path / "ledger.sqlite3"), "--metrics", f"127.0.0.1:{port}"])
    assert result.exit_code == 2 and result.output.startswith(f"Error: cannot serve metrics on 127.0.0.1:{port}")
