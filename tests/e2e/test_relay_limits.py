"""One client cannot use up a connector for everyone on its own route (``/mcp/connectors/<id>``).

Each 2025-era MCP session on the route has a connector process of its own. Most clients never send
DELETE when they crash or reconnect; here a raw client opens MCP sessions and abandons them, exactly so.
The daemon runs in-process with small caps; connectors are real processes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest

from sidecar.config import ConnectorSettings, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import running, until_running

pytestmark = pytest.mark.slow  # real connector processes

ECHO: Final = Path(__file__).resolve().parents[1] / "connectors" / "fixtures" / "echo_server.py"
BOUND: Final = 20.0
PER_SESSION: Final = 2
PER_CONNECTOR: Final = 3


async def _daemon(tmp_path: Path, workspace: Path, connectors: ConnectorSettings) -> AsyncIterator[Daemon]:
    root = tmp_path / "capped-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    async with running_daemon(paths, workspace, Settings(connectors=connectors)) as daemon:
        path = daemon.paths.config / "mcp.json"
        path.write_text(json.dumps({"mcpServers": {"echo": {"command": sys.executable, "args": [str(ECHO)]}}}))
        path.chmod(0o600)
        assert (await daemon.control("POST", "/control/connectors/echo/trust"))["state"] == "trusted"
        yield daemon


@pytest.fixture
async def capped(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    limits = ConnectorSettings(max_per_session=PER_SESSION, max_per_connector=PER_CONNECTOR)
    async for daemon in _daemon(tmp_path, workspace, limits):
        yield daemon


@pytest.fixture
async def quickly_idle(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async for daemon in _daemon(tmp_path, workspace, ConnectorSettings(idle_seconds=5)):
        yield daemon


async def _abandoned_mcp_session(session: dict[str, Any]) -> str:
    """Open a 2025-era MCP session on the route (its connector process starts) and never end it."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {**session["headers"], "Accept": "application/json, text/event-stream"}
    async with (
        asyncio.timeout(BOUND),
        aiohttp.ClientSession() as http,
        http.post(session["url"], json=body, headers=headers) as reply,
    ):
        assert reply.status == 200, await reply.text()
        text = await reply.text()
        if reply.content_type == "text/event-stream":
            text = next(line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip())
        answer = json.loads(text)
        assert "result" in answer, answer  # the connector answered: its process runs for this MCP session
        return reply.headers["mcp-session-id"]


async def test_a_client_that_never_ends_its_mcp_sessions_keeps_at_most_its_share(capped: Daemon) -> None:
    session = await capped.new_session(allow=["*"], mode="bypass", connector="echo")
    opened = [await _abandoned_mcp_session(session) for _ in range(PER_SESSION * 3)]
    assert len(set(opened)) == len(opened)  # each was a new MCP session, and each was answered
    assert await running(capped, "echo") == PER_SESSION  # the least recently used idle ones gave way

    # The connector still serves everyone else: another sidecar session gets its own processes.
    other = await capped.new_session(allow=["*"], mode="bypass", connector="echo")
    async with mcp_client(other) as client:
        result = await client.call_tool("echo", {"text": "still served"})
    assert not result.is_error


async def test_an_abandoned_relayed_process_is_reaped_when_idle(quickly_idle: Daemon) -> None:
    session = await quickly_idle.new_session(allow=["*"], mode="bypass", connector="echo")
    await _abandoned_mcp_session(session)
    assert await running(quickly_idle, "echo") == 1
    await until_running(quickly_idle, "echo", 0, timeout=BOUND)
