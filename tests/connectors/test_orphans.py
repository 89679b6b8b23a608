"""No descendant of a connector survives it, not even a ``setsid`` grandchild of its first millisecond (issue 11
item 5).

The daemon runs as ``sidecar serve`` in a subprocess (``daemon_process``): only a process that exists to
be the daemon becomes the child subreaper of its connectors' trees. The connector is
``fixtures/quick_forker.py``, which double-forks a grandchild that calls ``setsid`` at once, before the
connector answers ``initialize``; no scan of ``/proc`` could link the two. Untrusting the connector,
ending a session, a crash, and stopping the daemon each leave none of those grandchildren alive (bounded
waits), while another session's grandchild lives on; the daemon reaps what it adopted; and it still
answers ``/healthz``. The connector runs unsandboxed here (``"sidecarSandbox": false``), as where there is
no sandbox: in one, its PID namespace holds the tree instead (``test_sandboxed_orphans.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from sidecar.connectors.stdio.orphans import REAP_INTERVAL, TREE_VARIABLE
from sidecar.store.runtime import read_runtime
from tests.conftest import Daemon, DaemonProcess, mcp_client, start_daemon_process, stop_daemon_process
from tests.helpers import FIXTURES, python_server, request_json, tool_text, trust, wait_until, write_user_servers

pytestmark = pytest.mark.slow

CONNECTOR: Final = "quick"
ECHO: Final = f"mcp__{CONNECTOR}__echo"
BOUND: Final = 30.0
"""Seconds any one condition may take to come true (a fail-safe, not a timing assertion)."""


@dataclass
class Forking:
    """A subprocess daemon with ``quick_forker.py`` configured; ``pid_dir`` collects its grandchildren."""

    process: DaemonProcess
    daemon: Daemon
    pid_dir: Path

    def grandchildren(self) -> list[int]:
        """Every grandchild the connector's processes forked so far, oldest first."""
        return [int(p.name) for p in sorted(self.pid_dir.iterdir(), key=lambda p: p.stat().st_mtime_ns)]

    async def new_grandchild(self, known: int) -> int:
        """Wait (bounded) for a grandchild past the first ``known``, and return it once it runs."""
        await wait_until(lambda: len(self.grandchildren()) > known, timeout=BOUND)
        pid = self.grandchildren()[known]
        await wait_until(lambda: _alive(pid), timeout=BOUND)
        return pid


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _dead(pid: int) -> None:
    await wait_until(lambda: not _alive(pid), timeout=BOUND)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


async def _healthy(daemon: Daemon) -> None:
    assert await request_json("GET", f"{daemon.url}/healthz") == (200, {"status": "ok"})


async def _open(home: Path, workspace: Path, tmp_path: Path, *args: str) -> Forking:
    process = start_daemon_process(home)
    runtime = read_runtime(process.paths)
    assert runtime is not None
    daemon = Daemon(process.paths, runtime["url"], runtime["port"], runtime["control_token"], workspace)
    pid_dir = tmp_path / "grandchildren"
    pid_dir.mkdir()
    # Unsandboxed (an entry opted out, or no sandbox here): the subreaper is what holds its tree. A sandboxed
    # one's tree is its PID namespace (test_sandboxed_orphans.py).
    entry = {**python_server(FIXTURES / "quick_forker.py", str(pid_dir), *args), "sidecarSandbox": False}
    write_user_servers(daemon, {CONNECTOR: entry})
    return Forking(process, daemon, pid_dir)


@pytest.fixture
async def forking(home: Path, workspace: Path, tmp_path: Path) -> AsyncIterator[Forking]:
    opened = await _open(home, workspace, tmp_path)
    try:
        yield opened
    finally:
        stop_daemon_process(opened.process)
        for pid in opened.grandchildren():  # only if a test failed: leave nothing on the machine
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


async def _trusted_and_called(forking: Forking, **session: Any) -> tuple[dict[str, Any], int]:
    """Trust the connector (its probe forks a grandchild first) and call it in a new session; returns the
    session and the grandchild of that session's connector process."""
    if not forking.grandchildren():
        await trust(forking.daemon, CONNECTOR)
    known = len(forking.grandchildren())
    opened = await forking.daemon.new_session(mode="bypass", allow=[f"mcp__{CONNECTOR}__*"], **session)
    async with mcp_client(opened) as client:
        assert tool_text(await client.call_tool(ECHO, {"text": "hi"})) == "hi"
    return opened, await forking.new_grandchild(known)


async def test_the_probe_at_trust_time_leaves_no_grandchild(forking: Forking) -> None:
    await trust(forking.daemon, CONNECTOR)  # starts the connector once to learn its tools, then stops it
    [probe_grandchild] = forking.grandchildren()
    await _dead(probe_grandchild)
    await _healthy(forking.daemon)


async def test_untrusting_kills_the_setsid_grandchild_the_daemon_adopted(forking: Forking) -> None:
    _, grandchild = await _trusted_and_called(forking)
    daemon_pid = forking.process.proc.pid
    # Adopted: its parent is the daemon, not PID 1; and it carries its connector process's tag.
    assert psutil.Process(grandchild).ppid() == daemon_pid
    assert TREE_VARIABLE in psutil.Process(grandchild).environ()
    assert os.getsid(grandchild) == grandchild  # a session of its own: out of reach of killpg

    await forking.daemon.control("POST", f"/control/connectors/{CONNECTOR}/untrust")

    await _dead(grandchild)
    await wait_until(lambda: not _descendants(daemon_pid), timeout=BOUND)  # nothing left, zombies reaped
    await _healthy(forking.daemon)


async def test_ending_a_session_kills_its_grandchild_and_no_other(forking: Forking) -> None:
    first, first_grandchild = await _trusted_and_called(forking)
    second, second_grandchild = await _trusted_and_called(forking)

    await forking.daemon.control("DELETE", f"/control/sessions/{first['session_id']}")
    await _dead(first_grandchild)
    await asyncio.sleep(3 * REAP_INTERVAL)  # sweeps ran meanwhile: they must leave the other tree alone
    assert _alive(second_grandchild), "another session's grandchild was killed"

    await forking.daemon.control("DELETE", f"/control/sessions/{second['session_id']}")
    await _dead(second_grandchild)
    await _healthy(forking.daemon)


async def test_a_crash_kills_the_grandchild_of_the_crashed_process(forking: Forking) -> None:
    opened, grandchild = await _trusted_and_called(forking)
    async with mcp_client(opened) as client:
        result = await client.call_tool(f"mcp__{CONNECTOR}__crash", {})
        assert result.is_error
    await _dead(grandchild)
    await _healthy(forking.daemon)


async def test_stopping_the_daemon_leaves_no_grandchild(forking: Forking) -> None:
    _, grandchild = await _trusted_and_called(forking)
    stop_daemon_process(forking.process)
    assert forking.process.proc.returncode == 0
    await _dead(grandchild)


async def test_a_grandchild_that_exits_on_its_own_is_reaped_and_its_connector_carries_on(forking: Forking) -> None:
    opened, grandchild = await _trusted_and_called(forking)
    daemon_pid = forking.process.proc.pid
    os.kill(grandchild, signal.SIGKILL)  # it ends by itself, as far as the daemon knows

    def reaped() -> bool:
        return not [p for p in _descendants(daemon_pid) if p.pid == grandchild]

    await wait_until(reaped, timeout=BOUND)  # the daemon collected its exit status: no zombie remains
    async with mcp_client(opened) as client:  # the connector process itself was not reaped from under asyncio
        assert tool_text(await client.call_tool(ECHO, {"text": "still"})) == "still"
    shown = await forking.daemon.control("GET", f"/control/connectors/{CONNECTOR}")
    assert shown["running"] == 1 and shown["state"] == "trusted" and shown["connected_sessions"] == 1, shown
    await _healthy(forking.daemon)


async def test_a_grandchild_that_clears_its_environment_dies_with_its_session(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    forking = await _open(home, workspace, tmp_path, "--clear-env")
    try:
        opened, grandchild = await _trusted_and_called(forking)
        assert psutil.Process(grandchild).environ() == {}  # no tag to read: attributed by when it was born
        await forking.daemon.control("DELETE", f"/control/sessions/{opened['session_id']}")
        await _dead(grandchild)
        await _healthy(forking.daemon)
    finally:
        stop_daemon_process(forking.process)
        for pid in forking.grandchildren():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
