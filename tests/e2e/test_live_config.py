"""Connector config is live: edits take effect without a restart, and trust is checked again at every spawn.

The daemon runs in-process with its file watcher; connectors are real MCP servers in real subprocesses.
What the watcher did is read from ``GET /control/status``, which (unlike ``connectors list``) re-reads
nothing itself, so a change seen there was noticed by the watcher. Waits poll with a bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from sidecar.config import ConnectorSettings, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import copy_echo_server, tool_text

pytestmark = pytest.mark.slow  # real connector processes

ECHO: Final = Path(__file__).resolve().parents[1] / "connectors" / "fixtures" / "echo_server.py"
BOUND: Final = 10.0
"""Seconds any wait here may take (the watcher's own target is well under 2 s)."""


def _write_atomically(path: Path, servers: dict[str, Any]) -> None:
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps({"mcpServers": servers}))
    staged.chmod(0o600)
    os.replace(staged, path)  # as editors and config tools save: a rename over the old file


def _echo(*extra: str) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(ECHO), *extra]}


async def _connectors(daemon: Daemon) -> dict[str, dict[str, Any]]:
    status = await daemon.control("GET", "/control/status")
    return {c["id"]: c for c in status["connectors"]}


async def _until(daemon: Daemon, check: Callable[[dict[str, dict[str, Any]]], bool]) -> dict[str, dict[str, Any]]:
    async with asyncio.timeout(BOUND):
        while not check(found := await _connectors(daemon)):
            await asyncio.sleep(0.05)
    return found


def _echo_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if str(ECHO) in " ".join(p.cmdline())]


@pytest.fixture
async def echo(daemon: Daemon) -> Daemon:
    path = daemon.paths.config / "mcp.json"
    _write_atomically(path, {"echo": _echo()})
    assert (await daemon.control("POST", "/control/connectors/echo/trust"))["state"] == "trusted"
    return daemon


async def test_an_edited_launch_config_loses_its_trust_and_its_processes_without_a_restart(echo: Daemon) -> None:
    session = await echo.new_session(allow=["*"], mode="bypass")
    async with mcp_client(session) as client:
        assert not (await client.call_tool("mcp__echo__echo", {"text": "hi"})).is_error
        assert _echo_processes(), "the call did not start the connector"

        _write_atomically(echo.paths.config / "mcp.json", {"echo": _echo("--verbose")})
        found = await _until(echo, lambda c: c["echo"]["state"] != "trusted")
        assert (found["echo"]["state"], found["echo"]["running"], found["echo"]["connected_sessions"]) == (
            "changed",
            0,
            0,
        )

        names = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
        searched = await client.call_tool("tool_search", {"query": "echo text"})
        assert not any(name.startswith("mcp__echo__") for name in names)
        assert "mcp__echo__" not in json.dumps(searched.structured_content)
        refused = await client.call_tool("mcp__echo__echo", {"text": "hi"})
        assert refused.is_error
    async with asyncio.timeout(BOUND):
        while _echo_processes():
            await asyncio.sleep(0.05)


async def test_an_edit_changed_back_restores_the_route_and_the_tools_at_once(echo: Daemon) -> None:
    path = echo.paths.config / "mcp.json"
    session = await echo.new_session(allow=["*"], mode="bypass")
    _write_atomically(path, {"echo": _echo("--verbose")})
    await _until(echo, lambda c: c["echo"]["state"] == "changed")
    assert "connector:echo" not in (await echo.control("GET", "/control/status"))["routes"]

    _write_atomically(path, {"echo": _echo()})  # back to exactly what the user trusted
    await _until(echo, lambda c: c["echo"]["state"] == "trusted")
    assert "connector:echo" in (await echo.control("GET", "/control/status"))["routes"]
    async with mcp_client(session) as client:
        searched = await client.call_tool("tool_search", {"query": "echo text"})  # connector tools are deferred
        assert "mcp__echo__echo" in json.dumps(searched.structured_content)
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "back"})) == "back"
    routed = await echo.new_session(mode="bypass", connector="echo")  # its own route is mounted again
    async with mcp_client(routed) as client:
        assert tool_text(await client.call_tool("echo", {"text": "routed"})) == "routed"


async def test_a_new_server_appears_untrusted_and_a_removed_one_is_withdrawn(echo: Daemon) -> None:
    path = echo.paths.config / "mcp.json"
    _write_atomically(path, {"echo": _echo(), "other": _echo("other")})
    found = await _until(echo, lambda c: "other" in c)
    assert found["other"]["state"] == "configured"
    assert found["echo"]["state"] == "trusted"

    _write_atomically(path, {"other": _echo("other")})
    found = await _until(echo, lambda c: "echo" not in c)
    assert found["other"]["state"] == "configured"
    assert "connector:echo" not in (await echo.control("GET", "/control/status"))["routes"]


async def test_a_corrupt_edit_keeps_the_last_good_config_and_says_why(echo: Daemon) -> None:
    path = echo.paths.config / "mcp.json"
    path.write_text('{"mcpServers": {"echo": ')  # an editor saved half a file
    found = await _until(echo, lambda c: c["echo"].get("config_problem") is not None)
    assert found["echo"]["state"] == "trusted"
    assert str(path) in found["echo"]["config_problem"]
    status = await echo.control("GET", "/control/status")
    assert any(str(path) in problem for problem in status["connector_problems"])

    session = await echo.new_session(allow=["*"], mode="bypass")
    async with mcp_client(session) as client:
        result = await client.call_tool("mcp__echo__echo", {"text": "still here"})
    assert not result.is_error


async def test_a_file_replaced_in_two_steps_changes_nothing_but_what_changed(echo: Daemon) -> None:
    session = await echo.new_session(allow=["*"], mode="bypass")
    async with mcp_client(session) as client:
        assert not (await client.call_tool("mcp__echo__echo", {"text": "hi"})).is_error
        running = {p.pid for p in _echo_processes()}
        assert running

        path = echo.paths.config / "mcp.json"
        path.unlink()
        await asyncio.sleep(0.3)  # pacing: a tool that deletes, then writes the new file a moment later
        _write_atomically(path, {"echo": _echo(), "other": _echo("other")})
        found = await _until(echo, lambda c: "other" in c)  # the watcher has read the new file ...
        # ... and the moment without it withdrew nothing:
        assert (found["echo"]["state"], found["echo"]["connected_sessions"]) == ("trusted", 1)
        assert {p.pid for p in _echo_processes()} == running  # the same process still serves the session
        assert not (await client.call_tool("mcp__echo__echo", {"text": "again"})).is_error


@pytest.fixture
async def unwatched(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    """A daemon whose watcher is off, with a trusted connector package of its own."""
    root = tmp_path / "unwatched-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    package = paths.data / "connectors" / "echo-pkg"
    package.mkdir(parents=True)
    copy_echo_server(package)
    (package / "connector.json").write_text(
        json.dumps({"id": "echo-pkg", "name": "Echo", "description": "Echo.", "version": "1", "type": "mcp"})
    )
    servers = {"echo-pkg": {"command": sys.executable, "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py"]}}
    (package / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    for file in package.iterdir():
        file.chmod(0o600)
    settings = Settings(connectors=ConnectorSettings(watch=False))
    async with running_daemon(paths, workspace, settings) as daemon:
        assert (await daemon.control("POST", "/control/connectors/echo-pkg/trust"))["state"] == "trusted"
        yield daemon


async def test_an_edited_package_never_starts_even_when_no_watcher_noticed(unwatched: Daemon) -> None:
    server = unwatched.paths.data / "connectors" / "echo-pkg" / "server.py"
    with server.open("a") as code:
        code.write("\nimport os  # the package's code changed after trust\n")
    assert (await _connectors(unwatched))["echo-pkg"]["state"] == "trusted"  # nothing re-read it yet

    session = await unwatched.new_session(allow=["*"], mode="bypass")
    async with mcp_client(session) as client:
        refused = await client.call_tool("mcp__echo-pkg__echo", {"text": "hi"})
    assert refused.is_error
    assert "changed since it was trusted" in tool_text(refused)
    assert not _echo_processes(), "the edited package's code ran"
    assert (await _connectors(unwatched))["echo-pkg"]["state"] != "trusted"
