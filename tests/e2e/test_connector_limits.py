"""Process caps and idle reaping through the daemon, with real connector processes.

``[connectors] max_per_connector`` and ``max_total`` bound how many connector processes run, whoever
started them (a session's call on ``/mcp`` or an MCP session on a connector's own route); an idle
process is stopped and the next call starts it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import types

from sidecar.config import ConnectorSettings, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import (
    ECHO_SERVER,
    child_pids,
    python_server,
    running,
    tool_text,
    trust,
    until_running,
    write_user_servers,
)


async def _daemon_with(workspace: Path, **limits: float) -> AsyncIterator[Daemon]:
    settings = Settings(connectors=ConnectorSettings(**limits))
    async with running_daemon(Paths.resolve(), workspace, settings) as daemon:
        write_user_servers(daemon, {"echo": python_server(ECHO_SERVER), "other": python_server(ECHO_SERVER)})
        for connector in ("echo", "other"):
            await trust(daemon, connector)
        yield daemon


@pytest.fixture
async def capped(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async for daemon in _daemon_with(workspace, max_per_connector=1, max_total=2):
        yield daemon


@pytest.fixture
async def totalled(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async for daemon in _daemon_with(workspace, max_per_connector=4, max_total=2):
        yield daemon


@pytest.fixture
async def reaping(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async for daemon in _daemon_with(workspace, idle_seconds=5):
        yield daemon


def _messages(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return " | ".join(_messages(inner) for inner in exc.exceptions)
    return str(exc)


async def _call(daemon: Daemon, session: dict[str, object], tool: str) -> types.CallToolResult:
    async with mcp_client(session) as client:  # type: ignore[arg-type]
        return await client.call_tool(tool, {"text": "hi"})


async def test_the_per_connector_cap_refuses_a_process_until_one_ends(capped: Daemon) -> None:
    first = await capped.new_session(mode="bypass", allow=["*"])
    second = await capped.new_session(mode="bypass", allow=["*"])
    assert tool_text(await _call(capped, first, "mcp__echo__echo")) == "hi"
    before = child_pids()
    refused = await _call(capped, second, "mcp__echo__echo")
    assert refused.is_error and tool_text(refused) == "connector echo already runs 1 processes"
    assert child_pids() == before  # nothing was spawned for the refused call
    assert tool_text(await _call(capped, second, "mcp__other__echo")) == "hi"  # another connector has room
    await capped.control("DELETE", f"/control/sessions/{first['session_id']}")
    await until_running(capped, "echo", 0)
    assert tool_text(await _call(capped, second, "mcp__echo__echo")) == "hi"


async def test_the_total_cap_counts_the_relays_processes_too(totalled: Daemon) -> None:
    bus = await totalled.new_session(mode="bypass", allow=["*"])
    assert tool_text(await _call(totalled, bus, "mcp__echo__echo")) == "hi"
    assert tool_text(await _call(totalled, bus, "mcp__other__echo")) == "hi"  # two processes: the total cap
    routed = await totalled.new_session(mode="bypass", connector="other")
    before = child_pids()
    with pytest.raises(BaseException) as caught:  # the SDK client wraps the error in exception groups
        async with mcp_client(routed) as client:
            await client.list_tools()
    assert "sidecar already runs 2 connector processes" in _messages(caught.value)
    assert child_pids() == before


async def test_an_idle_process_is_stopped_and_the_next_call_starts_it_again(reaping: Daemon) -> None:
    session = await reaping.new_session(mode="bypass", allow=["mcp__echo__*"])
    async with mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "one"})) == "one"
        assert await running(reaping, "echo") == 1
        await until_running(reaping, "echo", 0, interval=0.2)  # idle_seconds = 5; the reaper looks every 1.25 s
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "two"})) == "two"
        assert await running(reaping, "echo") == 1
