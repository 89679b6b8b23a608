"""Configure a host once (issue 14 item 5): the daemon keeps its port, sessions and route tokens across a
restart until they expire; ended, rotated and expired ones stay refused; a taken port is a clear error;
a ``sidecar exec`` killed outright takes its session with it.

Real daemon subprocesses (``python -OO -m sidecar serve``), stopped gracefully or SIGKILLed and started
again on the same home and port; the MCP SDK's own client connects with the URL and headers it was
given before the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import pytest

from sidecar.auth.persist import StateJournal
from sidecar.paths import Paths
from sidecar.store.credentials import CredentialStore, DeferredKey
from tests.conftest import (
    STOP_TIMEOUT,
    Daemon,
    DaemonProcess,
    mcp_client,
    sidecar_env,
    start_daemon_process,
    stop_daemon_process,
)
from tests.helpers import control_request, initialize_request, request_json, tool_text, wait_until

BOUND: Final = 30.0
MCP_HEADERS: Final = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Every daemon a test starts, stopped at the end whatever happened."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        stop_daemon_process(daemon)


def _start(home: Path, daemons: list[DaemonProcess], port: int = 0) -> DaemonProcess:
    daemon = start_daemon_process(home, "--port", str(port))  # the last --port wins
    daemons.append(daemon)
    return daemon


def _expire_offline(home: Path, session_id: str) -> None:
    """Rewrite sessions.json as the daemon would once ``session_id`` expired: read, changed, sealed by the
    journal itself (an edit by hand is refused as a whole)."""
    paths = Paths.resolve(sidecar_env(home))
    key = DeferredKey(f"credentials:{paths.data}", paths.data / "credentials.key")
    journal = StateJournal(paths.state / "sessions.json", CredentialStore(paths.data / "credentials.enc", key))
    restored = journal.load()
    assert session_id in [s.id for s in restored.sessions]
    journal.sessions_changed(
        replace(s, expires_at=s.created_at - 1) if s.id == session_id else s for s in restored.sessions
    )


def _runtime(daemon: DaemonProcess) -> dict[str, Any]:
    return json.loads(daemon.paths.runtime_file.read_text())  # type: ignore[no-any-return]


def _crash(daemon: DaemonProcess) -> None:
    """SIGKILL: nothing of the daemon's own shutdown runs (a power cut, an OOM kill)."""
    daemon.proc.kill()
    daemon.proc.wait(STOP_TIMEOUT)


async def _control(daemon: DaemonProcess, method: str, path: str, body: Any = None, *, expect: int = 200) -> Any:
    runtime = _runtime(daemon)
    status, data = await control_request(runtime["url"], runtime["control_token"], method, path, body)
    assert status == expect, data
    return data


async def _initialize(session: dict[str, Any]) -> int:
    """The status of a raw ``initialize`` POST with the session's URL and headers."""
    status, _ = await request_json(
        "POST", session["url"], headers={**MCP_HEADERS, **session["headers"]}, body=initialize_request("host")
    )
    return status


async def _calculate(session: dict[str, Any]) -> str:
    async with mcp_client(session) as client:
        return tool_text(await client.call_tool("calculate", {"expression": "6*7"}))


def _audit(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    lines = daemon.paths.audit_file.read_text().splitlines()
    return [record for line in lines if (record := json.loads(line))["event"] == event]


@pytest.mark.slow
async def test_a_session_made_before_a_restart_connects_after_it_and_ended_expired_rotated_ones_do_not(
    home: Path, workspace: Path, daemons: list[DaemonProcess]
) -> None:
    first = _start(home, daemons)
    port = _runtime(first)["port"]
    body = {"workspace": str(workspace)}
    kept = await _control(first, "POST", "/control/sessions", body, expect=201)
    ended = await _control(first, "POST", "/control/sessions", body, expect=201)
    expiring = await _control(first, "POST", "/control/sessions", {**body, "ttl": 60}, expect=201)
    assert await _calculate(kept) == "42"
    await _control(first, "DELETE", f"/control/sessions/{ended['session_id']}")
    stop_daemon_process(first)  # SIGTERM: a graceful stop, as a service manager's restart

    # The clock passes the short session's expiry while the daemon is down (its TTL is at least 60 s).
    _expire_offline(home, expiring["session_id"])

    second = _start(home, daemons, port)
    assert _runtime(second)["url"] == kept["url"].removesuffix("/mcp")
    assert await _calculate(kept) == "42"  # the same URL and headers, a new daemon
    assert await _initialize(ended) == 403
    assert await _initialize(expiring) == 403
    calls = _audit(second, "tool.call")
    assert [c["session"] for c in calls] == [kept["session_id"]] * 2  # nothing ran for the refused two
    assert _audit(second, "session.restored")[-1]["sessions"] == [kept["session_id"]]
    # A stop ends nothing: the one session ended is the one the user ended.
    assert [r["session"] for r in _audit(second, "session.ended")] == [ended["session_id"]]

    # Rotating the route kills the token handed out before the restart, and that outlives a crash.
    second.cli("routes", "rotate", "connector-proxy")
    assert await _initialize(kept) == 401
    fresh = await _control(second, "POST", "/control/sessions", body, expect=201)
    _crash(second)

    third = _start(home, daemons, port)
    assert await _initialize(kept) == 401
    assert await _calculate(fresh) == "42"  # made after the rotation, kept through a SIGKILL
    assert len(_audit(third, "tool.call")) == 3


async def test_a_session_for_a_desktop_host_may_last_thirty_days_and_no_longer(daemon: Daemon) -> None:
    month = await daemon.new_session(ttl=30 * 86400)
    assert month["expires_at"] - month["session"]["created_at"] == 30 * 86400
    status, refused = await control_request(
        daemon.url,
        daemon.control_token,
        "POST",
        "/control/sessions",
        {"workspace": str(daemon.workspace), "ttl": 30 * 86400 + 1},
    )
    assert status == 400 and "30 days" in refused["error"]["message"]
    assert len((await daemon.control("GET", "/control/sessions"))["sessions"]) == 1


@pytest.mark.slow
def test_session_new_takes_a_ttl_in_days(home: Path, workspace: Path, daemons: list[DaemonProcess]) -> None:
    daemon = _start(home, daemons)
    raw = json.loads(daemon.cli("session", "new", "--ttl", "30d", "--workspace", str(workspace)).stdout)
    [listed] = json.loads(daemon.cli("session", "list", "--json").stdout)
    assert raw["expires_at"] == listed["expires_at"] == listed["created_at"] + 30 * 86400
    too_long = daemon.cli("session", "new", "--ttl", "31d", "--workspace", str(workspace), check=False)
    assert too_long.returncode == 1 and "30 days" in too_long.stderr
    assert daemon.cli("session", "new", "--ttl", "soon", check=False).returncode == 2


@pytest.mark.slow
def test_a_taken_port_is_refused_naming_the_process_that_holds_it(home: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "sidecar", "serve", "--port", str(port)],
            env=sidecar_env(home),
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in done.stderr
    assert "pytest" in done.stderr or "python" in done.stderr  # its command line
    assert "--port" in done.stderr and "Traceback" not in done.stderr
    assert not (home / "state" / "runtime.json").exists()


@pytest.mark.slow
async def test_sidecar_exec_killed_outright_takes_its_session_with_it(
    home: Path, tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    daemon = _start(home, daemons)
    env_file = tmp_path / "agent.env"
    # The agent notes its environment, then lives on (it is orphaned when sidecar exec dies).
    script = f"env > {env_file}.tmp && mv {env_file}.tmp {env_file} && exec sleep 300"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "exec", "--", "sh", "-c", script],
        env=daemon.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the orphaned agent is killed with it below
    )
    try:
        await wait_until(env_file.exists, timeout=BOUND)
        sessions = (await _control(daemon, "GET", "/control/sessions"))["sessions"]
        assert [s["owner_pid"] for s in sessions] == [proc.pid]
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        agent = {
            "url": env["SIDECAR_MCP_URL"],
            "headers": {
                "Authorization": env["SIDECAR_LOCAL_MCP_AUTHORIZATION"],
                "X-Sidecar-Context": env["SIDECAR_MCP_CONTEXT"],
            },
        }
        assert await _calculate(agent) == "42"

        proc.kill()  # SIGKILL: none of sidecar exec's own clean-up runs
        proc.wait(BOUND)

        async def gone() -> bool:
            return (await _control(daemon, "GET", "/control/sessions"))["sessions"] == []

        await wait_until(gone, timeout=BOUND)
        assert await _initialize(agent) == 403  # the orphaned agent's session is over
        assert [r["session"] for r in _audit(daemon, "session.ended")] == [sessions[0]["session_id"]]
        assert len(_audit(daemon, "tool.call")) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(BOUND)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned agent


@pytest.mark.slow
async def test_an_exec_session_outlives_a_restart_but_not_its_owner_dying_meanwhile(
    home: Path, tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    first = _start(home, daemons)
    port = _runtime(first)["port"]
    marker = tmp_path / "started"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "exec", "--", "sh", "-c", f"touch {marker}; exec sleep 300"],
        env=first.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        await wait_until(marker.exists, timeout=BOUND)
        [session] = (await _control(first, "GET", "/control/sessions"))["sessions"]
        _crash(first)
        second = _start(home, daemons, port)
        assert [s["session_id"] for s in (await _control(second, "GET", "/control/sessions"))["sessions"]] == [
            session["session_id"]
        ]
        stop_daemon_process(second)
        proc.kill()  # dies while no daemon runs
        proc.wait(BOUND)
        third = _start(home, daemons, port)

        async def gone() -> bool:
            return (await _control(third, "GET", "/control/sessions"))["sessions"] == []

        await wait_until(gone, timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(BOUND)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
async def test_a_session_on_a_connectors_own_route_connects_after_a_restart_until_it_is_untrusted(
    home: Path, workspace: Path, daemons: list[DaemonProcess]
) -> None:
    first = _start(home, daemons)
    port = _runtime(first)["port"]
    await _control(first, "POST", "/control/connectors/workspace/trust")
    body = {"workspace": str(workspace), "connector": "workspace"}
    session = await _control(first, "POST", "/control/sessions", body, expect=201)
    assert session["url"].endswith("/mcp/connectors/workspace")

    async def tools() -> list[str]:
        async with mcp_client(session) as client:
            return sorted(tool.name for tool in (await client.list_tools()).tools)

    before = await tools()
    assert "list_files" in before
    _crash(first)

    second = _start(home, daemons, port)
    assert await tools() == before  # the connector's own route, its token from before the restart
    await _control(second, "POST", "/control/connectors/workspace/untrust")
    assert await _initialize(session) == 401
    stop_daemon_process(second)

    third = _start(home, daemons, port)
    await _control(third, "POST", "/control/connectors/workspace/trust")  # trusted again: a new token
    assert await _initialize(session) == 401


@pytest.mark.parametrize("pid", [2**22, 1, 2**31], ids=["not-running", "init", "not-a-pid"])
async def test_a_session_cannot_name_an_owner_that_is_not_running(daemon: Daemon, pid: int) -> None:
    status, refused = await control_request(
        daemon.url,
        daemon.control_token,
        "POST",
        "/control/sessions",
        {"workspace": str(daemon.workspace), "owner_pid": pid},
    )
    assert status == 400, refused
    assert (await daemon.control("GET", "/control/sessions"))["sessions"] == []
    assert daemon.audit_events("session.created") == []
    assert not (daemon.paths.state / "sessions.json").exists()
