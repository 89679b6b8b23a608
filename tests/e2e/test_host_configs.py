"""Host configurations from ``sidecar session new --connector <id> --format …`` merge into one file.

Each connector's entry is named ``sidecar-<id>`` (the bus's stays ``sidecar``), so a user who adds the
shipped ``workspace`` connector and one of their own to the same host file keeps all three entries, and
each still reaches its own route. Through the real CLI and daemon; the merged entries are then used
as is by the SDK's client in both eras.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from tests.conftest import DaemonProcess, mcp_client
from tests.helpers import ECHO_SERVER, python_server, write_user_servers

pytestmark = pytest.mark.slow  # the CLI, the daemon and the connectors are real processes

CLI_TIMEOUT: Final = 30.0
MCP_TIMEOUT: Final = 20.0
SERVERS_KEY: Final = {"claude-code": "mcpServers", "cursor": "mcpServers", "vscode": "servers"}
"""Where each host keeps its servers (claude-desktop: mcpServers, through mcp-remote)."""


def _cli(d: DaemonProcess, *argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", *argv],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (argv, result.stdout, result.stderr)
    return result.stdout


def _session_new(d: DaemonProcess, workspace: Path, fmt: str, *extra: str) -> dict[str, Any]:
    out = _cli(d, "session", "new", "--workspace", str(workspace), "--mode", "bypass", "--format", fmt, *extra)
    config: dict[str, Any] = json.loads(out)
    return config


async def _tool_names(entry: dict[str, Any], mode: str) -> set[str]:
    async def go() -> set[str]:
        async with mcp_client(entry, mode=mode) as client:
            return {t.name for t in (await client.list_tools()).tools}

    return await asyncio.wait_for(go(), MCP_TIMEOUT)


async def test_configs_for_several_connectors_merge_into_one_host_file(
    daemon_process: DaemonProcess, workspace: Path
) -> None:
    d = daemon_process
    write_user_servers(d, {"echo": python_server(ECHO_SERVER)})  # type: ignore[arg-type]
    _cli(d, "connectors", "trust", "workspace")  # shipped with sidecar
    _cli(d, "connectors", "trust", "echo")  # the user's own
    url = json.loads(d.paths.runtime_file.read_text())["url"] + "/mcp"

    for fmt in ("claude-code", "cursor", "vscode", "claude-desktop"):
        key = SERVERS_KEY.get(fmt, "mcpServers")
        host_file: dict[str, Any] = {}
        for extra in (
            ("--allow", "builtin:*", "--allow", "mcp__echo__*"),
            ("--connector", "workspace"),
            ("--connector", "echo"),
        ):
            config = _session_new(d, workspace, fmt, *extra)
            assert list(config) == [key] and len(config[key]) == 1, config
            host_file.setdefault(key, {}).update(config[key])  # what "merge it into the host's file" does
        entries = host_file[key]
        assert set(entries) == {"sidecar", "sidecar-workspace", "sidecar-echo"}, fmt
        for name, route in (("sidecar", url), ("sidecar-workspace", f"{url}/connectors/workspace")):
            entry = entries[name]
            assert (entry["url"] if "url" in entry else entry["args"][2]) == route, (fmt, name)
        if fmt == "claude-code":
            merged = entries

    # Each merged entry still reaches its own route.
    for era in ("legacy", "2026-07-28"):
        echo = await _tool_names(merged["sidecar-echo"], era)
        assert echo == {"echo", "crash", "sleep", "sleep_logged", "env_keys", "argv"}, era
        bus = await _tool_names(merged["sidecar"], era)
        assert {"calculate", "tool_search", "tool_call"} <= bus, era  # echo's tools are deferred there
        own = await _tool_names(merged["sidecar-workspace"], era)
        assert own and not own & bus and not own & echo, era
