"""A sandboxed connector's ``setsid`` grandchild dies with it too (issue 22 item 3), held by the sandbox's PID
namespace instead of the daemon's subreaper.

The connector is ``fixtures/quick_forker.py`` (a grandchild double-forked and ``setsid`` in its first
millisecond, ``sleep 300``), in its sandbox, with the directory where it records its grandchildren
declared writable. Inside, the grandchild's parent is the namespace's init (``bwrap``); ending its session,
untrusting the connector and stopping the daemon each leave no grandchild alive, while another session's
lives on until its turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from sidecar.store.runtime import read_runtime
from tests.attackers import needs_sandbox
from tests.conftest import Daemon, DaemonProcess, mcp_client, start_daemon_process, stop_daemon_process
from tests.helpers import FIXTURES, python_server, tool_text, trust, wait_until, write_user_servers

pytestmark = [pytest.mark.slow, needs_sandbox()]

BOUND: Final = 30.0


def _grandchildren(process: DaemonProcess) -> set[int]:
    """The daemon's descendants that are a grandchild's ``sleep 300``."""
    found = set()
    for child in psutil.Process(process.proc.pid).children(recursive=True):
        try:
            if child.cmdline()[-1:] == ["300"] and child.name() == "sleep" and _alive(child.pid):
                found.add(child.pid)
        except psutil.Error:
            pass
    return found


@pytest.fixture
def forking(home: Path, workspace: Path, tmp_path: Path) -> Iterator[tuple[DaemonProcess, Daemon]]:
    process = start_daemon_process(home)
    try:
        runtime = read_runtime(process.paths)
        assert runtime is not None
        daemon = Daemon(process.paths, runtime["url"], runtime["port"], runtime["control_token"], workspace)
        pid_dir = tmp_path / "grandchildren"
        pid_dir.mkdir()
        write_user_servers(daemon, {"quick": python_server(FIXTURES / "quick_forker.py", str(pid_dir), writes=pid_dir)})
        yield process, daemon
    finally:
        stop_daemon_process(process)
        leftover = _grandchildren(process) if process.proc.poll() is None else set()
        for pid in leftover:  # only if a test failed: leave nothing on the machine
            psutil.Process(pid).kill()


async def _session_with_grandchild(process: DaemonProcess, daemon: Daemon) -> tuple[dict[str, Any], int]:
    before = _grandchildren(process)
    session = await daemon.new_session(mode="bypass", allow=["mcp__quick__*"])
    async with mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__quick__echo", {"text": "hi"})) == "hi"
    await wait_until(lambda: len(_grandchildren(process) - before) == 1, timeout=BOUND)
    (grandchild,) = _grandchildren(process) - before
    return session, grandchild


async def test_a_sandboxed_grandchild_dies_with_its_session_its_trust_and_the_daemon(
    forking: tuple[DaemonProcess, Daemon],
) -> None:
    process, daemon = forking
    shown = await trust(daemon, "quick")
    assert shown["sandbox"]["mode"] == "on"
    await wait_until(lambda: not _grandchildren(process), timeout=BOUND)  # the probe's went with it
    first, doomed = await _session_with_grandchild(process, daemon)
    _, kept = await _session_with_grandchild(process, daemon)
    assert psutil.Process(doomed).parent().name() == "bwrap"  # the namespace's init holds it, not PID 1
    await daemon.control("DELETE", f"/control/sessions/{first['session_id']}")
    await wait_until(lambda: doomed not in _grandchildren(process), timeout=BOUND)
    assert kept in _grandchildren(process)  # another session's lives on
    await daemon.control("POST", "/control/connectors/quick/untrust")
    await wait_until(lambda: not _grandchildren(process), timeout=BOUND)


async def test_stopping_the_daemon_leaves_no_sandboxed_grandchild(forking: tuple[DaemonProcess, Daemon]) -> None:
    process, daemon = forking
    await trust(daemon, "quick")
    _, grandchild = await _session_with_grandchild(process, daemon)
    stop_daemon_process(process)
    await wait_until(lambda: not _alive(grandchild), timeout=BOUND)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
