"""Supervision through the daemon: a connector that hangs, floods, crash-loops or forks hurts only itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.config import ConnectorSettings, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import (
    FIXTURES,
    host_pid,
    python_server,
    rest,
    tool_text,
    trust,
    until_running,
    wait_until,
    write_user_servers,
)

BOUND = 60.0


@pytest.fixture
async def strict(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    settings = Settings(connectors=ConnectorSettings(start_timeout=3.0))
    async with running_daemon(Paths.resolve(), workspace, settings) as d:
        yield d


def _fixture(name: str, writes: Path | None = None, **env: str) -> dict[str, Any]:
    return python_server(FIXTURES / name, env=env, writes=writes)


async def _echo_still_works(daemon: Daemon) -> None:
    assert await daemon.control("GET", "/healthz") == {"status": "ok"}
    await trust(daemon, "echo")
    session = await daemon.new_session(mode="bypass", allow=["*"])
    async with mcp_client(session) as client:
        assert (await client.list_tools()).tools
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "still here"})) == "still here"


@pytest.mark.parametrize(("fixture", "reason"), [("hang.py", "did not start"), ("flood.py", "line over")])
async def test_a_connector_that_hangs_or_floods_is_an_error_and_nothing_else_suffers(
    strict: Daemon, fixture: str, reason: str
) -> None:
    write_user_servers(strict, {"bad": _fixture(fixture), "echo": _fixture("echo_server.py")})
    async with asyncio.timeout(BOUND):
        shown = await strict.control("POST", "/control/connectors/bad/trust")
    assert shown["state"] == "error" and reason in shown["error"], shown
    await _echo_still_works(strict)


async def test_a_crash_loop_ends_in_error_with_the_reason(strict: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "crash-from-now-on"
    write_user_servers(
        strict,
        {"loopy": _fixture("crash_later.py", tmp_path, CRASH_MARKER=str(marker)), "echo": _fixture("echo_server.py")},
    )
    await trust(strict, "loopy")
    session = await strict.new_session(mode="bypass", allow=["*"])
    async with mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__loopy__ping", {})) == "pong"
        marker.write_text("")
        await client.call_tool("mcp__loopy__crash", {})  # from now on every restart dies at once
        async with asyncio.timeout(BOUND):
            while True:
                result = await client.call_tool("tool_call", {"name": "mcp__loopy__ping"})
                if "is in error" in tool_text(result) or "not found or not available" in tool_text(result):
                    _, visible = await rest(strict, "GET", "/api/v1/mcp/tools", session["headers"])
                    if "mcp__loopy__ping" not in {t["name"] for t in visible["tools"]}:
                        break
                await asyncio.sleep(0.2)
    await _echo_still_works(strict)


def _sleepers(since: float) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        cmdline = proc.info["cmdline"] or []
        if (
            len(cmdline) == 2
            and Path(cmdline[0]).name == "sleep"
            and cmdline[1] == "300"
            and (proc.info["create_time"] >= since - 1)
        ):
            found.append(proc)
    return found


async def test_a_connector_that_forks_into_the_background_leaves_nothing_behind(strict: Daemon) -> None:
    started = time.time()
    write_user_servers(strict, {"forker": _fixture("forker.py")})
    await trust(strict, "forker")
    session = await strict.new_session(mode="bypass", allow=["mcp__forker__*"])
    async with mcp_client(session) as client:
        found = json.loads(tool_text(await client.call_tool("mcp__forker__orphan", {})))
        assert len(_sleepers(started)) >= 2  # its same-group child and its setsid escapee
        pids = [host_pid(found[name], found["pidns"]) for name in ("intermediate", "escapee")]
    await strict.control("DELETE", f"/control/sessions/{session['session_id']}")
    await wait_until(
        lambda: not _sleepers(started) and not any(psutil.pid_exists(p) for p in pids),
        timeout=BOUND,
        interval=0.1,
    )


async def test_a_relayed_connector_that_dies_mid_call_fails_that_mcp_session_only(strict: Daemon) -> None:
    write_user_servers(strict, {"echo": _fixture("echo_server.py")})
    await trust(strict, "echo")
    session = await strict.new_session(mode="bypass", connector="echo")
    async with mcp_client(session) as client:
        with pytest.raises(Exception) as died:
            await client.call_tool("crash", {})
        assert "connector echo stopped" in str(died.value), died.value
        with pytest.raises(Exception, match="not running for this MCP session; start a new session"):
            await client.call_tool("echo", {"text": "again"})
        await until_running(strict, "echo", 0, timeout=BOUND)  # its process is gone
    async with mcp_client(session) as fresh:  # a new MCP session on the same route gets a new process
        assert tool_text(await fresh.call_tool("echo", {"text": "back"})) == "back"
    await _echo_still_works(strict)


async def test_a_relayed_2026_connection_that_dies_is_reopened_on_the_next_request(strict: Daemon) -> None:
    write_user_servers(strict, {"echo": _fixture("echo_server.py")})
    await trust(strict, "echo")
    session = await strict.new_session(mode="bypass", connector="echo")
    async with mcp_client(session, mode="2026-07-28") as client:
        with pytest.raises(Exception, match="connector echo stopped"):
            await client.call_tool("crash", {})
        # 2026-07-28 requests are self-contained: the next one simply gets a new shared process.
        assert tool_text(await client.call_tool("echo", {"text": "back"})) == "back"
        assert (await strict.control("GET", "/control/connectors/echo"))["running"] == 1
