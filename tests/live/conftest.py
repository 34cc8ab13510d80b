"""One scripted model and one real Codex app-server per test module.

Each test gets its own workspace (and so its own threads) on the shared server,
just as a harness and tillerman share one server in production.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeUnavailable, claude_binary
from fixtures.codex_server import AppServer, make_codex_home
from fixtures.scripted_model import ScriptedModel


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # websockets' client is asyncio-only


@pytest.fixture(scope="module")
def scripted_model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as model:
        yield model


@pytest.fixture(scope="module")
def app_server(scripted_model: ScriptedModel) -> Iterator[AppServer]:
    home = make_codex_home(scripted_model.base_url)
    try:
        with AppServer(home) as server:
            yield server
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def workspace(app_server: AppServer, request: pytest.FixtureRequest) -> Path:
    path = app_server.codex_home / f"ws-{request.node.name}"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def claude_cli() -> Path:
    """The pinned Claude Code CLI, installed on first use; skips, saying why, without npm or a registry."""
    try:
        return claude_binary()
    except ClaudeUnavailable as reason:
        pytest.skip(str(reason))


@pytest.fixture(scope="module")
def anthropic_model() -> Iterator[AnthropicModel]:
    with AnthropicModel() as model:
        yield model
