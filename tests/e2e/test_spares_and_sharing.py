"""Warm spares and shared connector processes through the daemon, with real connector subprocesses.

Issue 15 items 3 and 4. The connector is ``fixtures/pid_server.py`` as the user's own server with a
``cwd`` of its own (nothing per session in its launch config): ``whoami`` answers with the pid of the
process that served the call, so every claim here is about processes, never about time.

* A new session's first call takes the warm spare: the pid that answers existed before the call.
* Spares count against the caps, never take the last free place, and give way to a session's process.
* Untrusting the connector stops its spares; nothing is left behind.
* ``"process": "shared"``: one process serves three sessions at once, each getting only its own answers
  and progress; ending one session cancels its call in that process (the connector sees the cancel)
  while another session's call there completes; a crash restarts it for everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
    child_pids,
    host_pid,
    python_server,
    tool_text,
    trust,
    until_running,
    wait_until,
    write_user_servers,
)

PID_SERVER = FIXTURES / "pid_server.py"
TOOLS = ["mcp__pid__*", "mcp__other__*"]


@pytest.fixture(autouse=True)
def _own_home(home: Path) -> Path:
    """Every test's daemon keeps its config and state under the test's own home."""
    return home


def _entry(cwd: Path, **extra: Any) -> dict[str, Any]:
    return {**python_server(PID_SERVER, writes=cwd), "cwd": str(cwd), **extra}


@contextlib.asynccontextmanager
async def _daemon(workspace: Path, servers: dict[str, Any], **settings: Any) -> AsyncIterator[Daemon]:
    async with running_daemon(Paths.resolve(), workspace, Settings(connectors=ConnectorSettings(**settings))) as daemon:
        write_user_servers(daemon, servers)
        for connector in servers:
            await trust(daemon, connector)
        yield daemon


async def _shown(daemon: Daemon, connector: str) -> dict[str, Any]:
    shown: dict[str, Any] = await daemon.control("GET", f"/control/connectors/{connector}")
    return shown


async def _until_spares(daemon: Daemon, connector: str, count: int) -> None:
    async def ready() -> bool:
        return (await _shown(daemon, connector))["spares"] == count

    await wait_until(ready)


async def _whoami(session: dict[str, Any], say: str, connector: str = "pid") -> int:
    async with mcp_client(session) as client:
        result = await client.call_tool(f"mcp__{connector}__whoami", {"say": say})
    assert not result.is_error, tool_text(result)
    answer = json.loads(tool_text(result))
    assert answer["say"] == say
    return host_pid(answer["pid"], answer["pidns"])


def _gone(pid: int) -> bool:
    return pid not in child_pids()


# -- warm spares -------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_new_sessions_first_call_takes_the_warm_spare(workspace: Path, tmp_path: Path) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path)}) as daemon:
        assert (await _shown(daemon, "pid"))["process"] == "session"
        await _until_spares(daemon, "pid", 1)  # the probe at trust was the first take: a spare followed it
        await until_running(daemon, "pid", 1)  # the spare alone; the probe has stopped
        served = []
        for n in range(3):
            before = child_pids()
            session = await daemon.new_session(mode="bypass", allow=TOOLS)
            pid = await _whoami(session, f"session {n}")
            assert pid in before  # nothing was spawned for this first call: it took the spare
            served.append(pid)
            await _until_spares(daemon, "pid", 1)  # taken, and replaced in the background
        assert len(set(served)) == 3  # each session has its own process: a spare serves one session only
        assert await _whoami(session, "again") == served[-1]  # a session keeps the process it took
        await until_running(daemon, "pid", 4)  # three sessions' processes and one spare


@pytest.mark.slow
async def test_spares_count_against_the_caps_and_give_way_to_a_sessions_process(
    workspace: Path, tmp_path: Path
) -> None:
    servers = {"pid": _entry(tmp_path), "other": _entry(tmp_path)}
    async with _daemon(workspace, servers, max_per_connector=3, max_total=3) as daemon:
        first = await daemon.new_session(mode="bypass", allow=TOOLS)
        a = await _whoami(first, "a")
        await _until_spares(daemon, "pid", 1)  # 1 process + 1 spare leaves the third place free
        second = await daemon.new_session(mode="bypass", allow=TOOLS)
        before = child_pids()
        b = await _whoami(second, "b")
        assert b in before and b != a  # the spare
        third = await daemon.new_session(mode="bypass", allow=TOOLS)
        c = await _whoami(third, "c")  # the last place: a cold start, since no spare took it
        assert c not in before
        assert (await _shown(daemon, "pid"))["spares"] == 0
        await until_running(daemon, "pid", 3)
        fourth = await daemon.new_session(mode="bypass", allow=TOOLS)
        async with mcp_client(fourth) as client:
            refused = await client.call_tool("mcp__pid__whoami", {"say": "d"})
        assert refused.is_error and tool_text(refused) == "connector pid already runs 3 processes"

    # The total cap: a spare of one connector gives way to another connector's session process.
    async with _daemon(workspace, servers, max_per_connector=3, max_total=3) as daemon:
        first = await daemon.new_session(mode="bypass", allow=TOOLS)
        await _whoami(first, "a")
        await _until_spares(daemon, "pid", 1)
        spare = (child_pids() - {await _whoami(first, "again")}) & _connector_pids("pid_server.py")
        assert len(spare) == 1
        await _whoami(first, "x", connector="other")  # the third and last place
        second = await daemon.new_session(mode="bypass", allow=TOOLS)
        await _whoami(second, "y", connector="other")  # no place left but the spare's: it gives way
        assert _gone(next(iter(spare)))
        assert (await _shown(daemon, "pid"))["running"] == 1
        assert (await _shown(daemon, "other"))["running"] == 2


def _connector_pids(script: str) -> set[int]:
    found = set()
    for pid in child_pids():
        with contextlib.suppress(psutil.Error):
            if any(script in part for part in psutil.Process(pid).cmdline()):
                found.add(pid)
    return found


@pytest.mark.slow
async def test_untrusting_stops_the_spares_and_nothing_is_left_behind(workspace: Path, tmp_path: Path) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path)}) as daemon:
        await _until_spares(daemon, "pid", 1)
        [spare] = _connector_pids("pid_server.py")
        await daemon.control("POST", "/control/connectors/pid/untrust")
        await wait_until(lambda: _gone(spare))
        assert (await _shown(daemon, "pid"))["running"] == 0
        assert _connector_pids("pid_server.py") == set()


@pytest.mark.slow
async def test_a_config_change_stops_the_spares(workspace: Path, tmp_path: Path) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path)}) as daemon:
        await _until_spares(daemon, "pid", 1)
        [spare] = _connector_pids("pid_server.py")
        (tmp_path / "elsewhere").mkdir()
        write_user_servers(daemon, {"pid": _entry(tmp_path / "elsewhere")})  # a new config: trust is gone
        await wait_until(lambda: _gone(spare))
        await trust(daemon, "pid")
        session = await daemon.new_session(mode="bypass", allow=TOOLS)
        assert await _whoami(session, "new") != spare


@pytest.mark.slow
async def test_with_spares_off_a_session_starts_its_own_process(workspace: Path, tmp_path: Path) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path)}, spares=0) as daemon:
        session = await daemon.new_session(mode="bypass", allow=TOOLS)
        before = child_pids()
        assert await _whoami(session, "cold") not in before
        assert (await _shown(daemon, "pid"))["spares"] == 0
        await until_running(daemon, "pid", 1)


@pytest.mark.slow
async def test_a_connector_with_a_per_session_placeholder_gets_no_spare(workspace: Path, tmp_path: Path) -> None:
    entry = _entry(tmp_path, env={"WHERE": "${SIDECAR_PROJECT_DIR}"})
    async with _daemon(workspace, {"pid": entry}) as daemon:
        session = await daemon.new_session(mode="bypass", allow=TOOLS)
        before = child_pids()
        assert await _whoami(session, "cold") not in before  # today's lazy start
        await until_running(daemon, "pid", 1)
        assert (await _shown(daemon, "pid"))["spares"] == 0


# -- one shared process ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_one_shared_process_serves_three_sessions_each_seeing_only_its_own(
    workspace: Path, tmp_path: Path
) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path, process="shared")}) as daemon:
        assert (await _shown(daemon, "pid"))["process"] == "shared"
        sessions = [await daemon.new_session(mode="bypass", allow=TOOLS) for _ in range(3)]

        async def use(n: int) -> tuple[int, str, list[str | None]]:
            seen: list[str | None] = []

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(message)

            async with mcp_client(sessions[n]) as client:
                answer = json.loads(tool_text(await client.call_tool("mcp__pid__whoami", {"say": f"s{n}"})))
                pid = host_pid(answer["pid"], answer["pidns"])
                ticked = await client.call_tool(
                    "mcp__pid__tick", {"label": f"s{n}", "steps": 5}, progress_callback=progress
                )
            return pid, tool_text(ticked), seen

        results = await asyncio.gather(*(use(n) for n in range(3)))
        assert len({pid for pid, _, _ in results}) == 1  # one process served them all
        for n, (_, answer, seen) in enumerate(results):
            assert answer == f"s{n}"
            assert seen == [f"s{n}"] * 5  # its own progress, all of it, and no other session's
        assert _connector_pids("pid_server.py") == {results[0][0]}
        assert (await _shown(daemon, "pid"))["running"] == 1
        assert (await _shown(daemon, "pid"))["connected_sessions"] == 3


@pytest.mark.slow
async def test_ending_a_session_cancels_its_call_in_the_shared_process_and_no_other(
    workspace: Path, tmp_path: Path
) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path, process="shared")}) as daemon:
        revoked = await daemon.new_session(mode="bypass", allow=TOOLS)
        kept = await daemon.new_session(mode="bypass", allow=TOOLS)
        shared = await _whoami(kept, "before")
        logs = {name: tmp_path / f"{name}.log" for name in ("revoked", "kept")}

        async def sleep(session: dict[str, Any], log: Path, seconds: float) -> Any:
            async with mcp_client(session) as client:
                return await client.call_tool("mcp__pid__sleep_logged", {"seconds": seconds, "log": str(log)})

        doomed = asyncio.create_task(sleep(revoked, logs["revoked"], 600))
        survivor = asyncio.create_task(sleep(kept, logs["kept"], 3))
        await wait_until(lambda: all(log.exists() for log in logs.values()), interval=0.02)
        await daemon.control("DELETE", f"/control/sessions/{revoked['session_id']}")
        await wait_until(lambda: "cancelled" in logs["revoked"].read_text(), interval=0.02)
        assert logs["kept"].read_text() == "started\n"  # the other session's call runs on
        result = await asyncio.wait_for(survivor, 30)
        assert tool_text(result) == "slept" and logs["kept"].read_text() == "started\nfinished\n"
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(doomed, 30)
        assert await _whoami(kept, "after") == shared  # the shared process was not restarted
        assert logs["revoked"].read_text() == "started\ncancelled\n"


@pytest.mark.slow
async def test_the_shared_process_is_restarted_after_a_crash_and_stops_with_its_trust(
    workspace: Path, tmp_path: Path
) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path, process="shared")}) as daemon:
        session = await daemon.new_session(mode="bypass", allow=TOOLS)
        first = await _whoami(session, "one")
        psutil.Process(first).kill()
        await wait_until(lambda: _gone(first))

        async def serves_again() -> bool:
            async with mcp_client(session) as client:
                result = await client.call_tool("mcp__pid__whoami", {"say": "two"})
            return not result.is_error

        await wait_until(serves_again, interval=0.2)  # the supervisor restarts it after its backoff
        [second] = _connector_pids("pid_server.py")
        assert second != first
        await daemon.control("POST", "/control/connectors/pid/untrust")
        await wait_until(lambda: _gone(second))
        assert _connector_pids("pid_server.py") == set()


async def test_shared_is_refused_for_a_config_with_a_session_placeholder(workspace: Path, tmp_path: Path) -> None:
    async with running_daemon(Paths.resolve(), workspace) as daemon:
        entry = _entry(tmp_path, process="shared", args=[str(PID_SERVER), "${SIDECAR_PROJECT_DIR}"])
        write_user_servers(daemon, {"pid": entry})
        listing = await daemon.control("GET", "/control/connectors")
        assert "pid" not in {c["id"] for c in listing["connectors"]}
        [problem] = listing["problems"]
        assert "mcpServers.pid" in problem and "its args uses ${SIDECAR_PROJECT_DIR}" in problem
        await daemon.control("POST", "/control/connectors/pid/trust", expect=404)
        assert _connector_pids("pid_server.py") == set()  # nothing ran


@pytest.mark.slow
async def test_the_setting_shares_every_eligible_connector(workspace: Path, tmp_path: Path) -> None:
    servers = {"pid": _entry(tmp_path), "other": {**python_server(PID_SERVER)}}  # other: no cwd of its own
    async with _daemon(workspace, servers, share_processes=True, spares=0) as daemon:
        assert (await _shown(daemon, "pid"))["process"] == "shared"
        assert (await _shown(daemon, "other"))["process"] == "session"
        one = await daemon.new_session(mode="bypass", allow=TOOLS)
        two = await daemon.new_session(mode="bypass", allow=TOOLS)
        assert await _whoami(one, "a") == await _whoami(two, "b")
        assert await _whoami(one, "a", "other") != await _whoami(two, "b", "other")


@pytest.mark.slow
async def test_a_spare_gives_way_to_a_connection_on_the_connectors_own_route(workspace: Path, tmp_path: Path) -> None:
    async with _daemon(workspace, {"pid": _entry(tmp_path)}, max_per_connector=3, max_total=3) as daemon:
        first = await daemon.new_session(mode="bypass", allow=TOOLS)
        await _whoami(first, "a")
        await _until_spares(daemon, "pid", 1)  # the process and its spare; one place left
        spare = _connector_pids("pid_server.py") - {await _whoami(first, "again")}
        assert len(spare) == 1
        relayed = [await daemon.new_session(mode="bypass", connector="pid") for _ in range(2)]
        async with mcp_client(relayed[0]) as one, mcp_client(relayed[1]) as two:  # the second needs the spare's place
            for client, say in ((one, "r1"), (two, "r2")):
                answer = await client.call_tool("whoami", {"say": say})
                assert not answer.is_error and json.loads(tool_text(answer))["say"] == say, answer
            assert _gone(next(iter(spare)))
