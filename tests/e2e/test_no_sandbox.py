"""Where there is no sandbox (issue 22 item 4): the daemon says so at start, in ``sidecar status``, and in
``connectors show``; a connector runs unconfined, shown as such, unless it requires a sandbox, which then
does not start. "No bubblewrap" is made real by naming a program that does not exist
(``[connectors] sandbox``), on a real daemon process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.store.runtime import read_runtime
from tests.conftest import Daemon, DaemonProcess, mcp_client, start_daemon_process, stop_daemon_process
from tests.helpers import ECHO_SERVER, child_pids, python_server, tool_text, write_user_servers

pytestmark = pytest.mark.slow

MISSING = "/nonexistent/bwrap"


@pytest.fixture
def unsandboxed(home: Path, workspace: Path) -> Iterator[tuple[DaemonProcess, Daemon]]:
    (home / "config").mkdir(mode=0o700, parents=True)
    settings = home / "config" / "sidecar.toml"
    settings.write_text(f'[connectors]\nsandbox = "{MISSING}"\n')
    settings.chmod(0o600)
    process = start_daemon_process(home)
    try:
        runtime = read_runtime(process.paths)
        assert runtime is not None
        yield process, Daemon(process.paths, runtime["url"], runtime["port"], runtime["control_token"], workspace)
    finally:
        stop_daemon_process(process)


async def test_without_a_sandbox_the_daemon_says_so_everywhere_and_a_connector_runs_unconfined(
    unsandboxed: tuple[DaemonProcess, Daemon], home: Path
) -> None:
    process, daemon = unsandboxed
    assert f"connectors are NOT sandboxed: bubblewrap ({MISSING}) is not installed" in (home / "daemon.log").read_text()
    status = json.loads(process.cli("status", "--json").stdout)
    assert status["sandbox"] == {
        "available": False,
        "reason": f"bubblewrap ({MISSING}) is not installed: connectors run unconfined",
        "abstract_sockets_scoped": False,
        "keyrings_refused": False,
    }
    assert "sandbox:    NONE: bubblewrap" in process.cli("status").stdout
    write_user_servers(daemon, {"echo": python_server(ECHO_SERVER)})
    await daemon.control("POST", "/control/connectors/echo/trust")
    shown = process.cli("connectors", "show", "echo").stdout
    assert "sandbox      NONE here, so it runs as you, with your files: bubblewrap" in shown
    session = await daemon.new_session(mode="bypass", allow=["mcp__echo__*"])
    async with mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "unconfined"})) == "unconfined"
    granted = [r for r in daemon.audit_events("trust.granted") if r["name"] == "echo"]
    assert granted[-1]["sandbox"] == "none"


async def test_a_connector_that_requires_a_sandbox_does_not_start_without_one(
    unsandboxed: tuple[DaemonProcess, Daemon],
) -> None:
    _, daemon = unsandboxed
    entry = {**python_server(ECHO_SERVER), "sidecarSandbox": {"required": True}}
    write_user_servers(daemon, {"strict": entry})
    before = child_pids()
    shown = await daemon.control("POST", "/control/connectors/strict/trust")
    assert shown["state"] == "error" and "requires a sandbox, and there is none here" in shown["error"], shown
    assert shown["sandbox"]["mode"] == "refused"
    assert child_pids() - before == set()  # nothing of it ran
    session = await daemon.new_session(mode="bypass", allow=["mcp__strict__*"])
    async with mcp_client(session) as client:
        refused = await client.call_tool("mcp__strict__echo", {"text": "x"})
    assert refused.is_error
