"""The lifecycle's words keep the design's meanings (issue 10, item 5), through the real daemon.

A connector is ``configured``, ``trusted``, ``changed`` or ``error`` (and ``unauthorized``, once OAuth is
built); processes are per session, so ``connected`` and ``disconnected`` say what one session has of it,
and the daemon counts the sessions that have it connected. ``connectors list``, ``show``, ``status``, the
control API and ``list_connectors`` use the same words.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, Final

import pytest

from tests.conftest import Daemon, cli_output, mcp_client
from tests.helpers import ECHO_SERVER, FIXTURES, python_server, tool_text, trust, wait_until, write_user_servers

pytestmark = pytest.mark.slow  # connectors run as processes, the CLI as a process

BOUND: Final = 30.0


async def _everywhere(daemon: Daemon, home: Path, connector: str) -> tuple[str, int]:
    """The connector's state and connected-session count, checked equal on every surface that shows them."""
    listed = {c["id"]: c for c in (await daemon.control("GET", "/control/connectors"))["connectors"]}[connector]
    shown = await daemon.control("GET", f"/control/connectors/{connector}")
    status = {c["id"]: c for c in (await daemon.control("GET", "/control/status"))["connectors"]}[connector]
    facts = {(c["state"], c["connected_sessions"]) for c in (listed, shown, status)}
    assert len(facts) == 1, facts
    state, sessions = facts.pop()
    cli_list, cli_show, cli_status = await asyncio.gather(
        cli_output(home, "connectors", "list"),
        cli_output(home, "connectors", "show", connector),
        cli_output(home, "status"),
    )
    row = next(line for line in cli_list.splitlines() if line.startswith(connector + " "))
    assert row.split()[1:3] == [state, str(sessions)], row
    assert re.search(rf"^state\s+{state}$", cli_show, re.MULTILINE), cli_show
    assert re.search(rf"^connected_sessions\s+{sessions}$", cli_show, re.MULTILINE), cli_show
    said = f"{state}, connected in {sessions} session" if sessions else state
    assert f"{connector} ({said}" in cli_status, cli_status
    return state, sessions


async def _as_agent(session: dict[str, Any], connector: str) -> str | None:
    """The connector's state as ``list_connectors`` tells that session (None: not told of it)."""
    async with mcp_client(session) as client:
        found = (await client.call_tool("list_connectors", {})).structured_content
    states = {c["id"]: c["state"] for c in found["connectors"]}  # type: ignore[index]
    return states.get(connector)


async def test_each_state_means_what_the_design_says_on_every_surface(daemon: Daemon, home: Path) -> None:
    write_user_servers(daemon, {"echo": python_server(ECHO_SERVER)})
    one = await daemon.new_session(mode="bypass", allow=["*"])
    two = await daemon.new_session(mode="bypass", allow=["*"])
    assert await _everywhere(daemon, home, "echo") == ("configured", 0)  # written in a config, not trusted
    assert await _as_agent(one, "echo") is None  # nothing untrusted is listed

    await trust(daemon, "echo")
    assert await _everywhere(daemon, home, "echo") == ("trusted", 0)  # trusted; no session's process yet
    assert await _as_agent(one, "echo") == "disconnected"  # this session has no process of it (yet)

    async with mcp_client(one) as client:  # the first call starts this session's process
        assert tool_text(await client.call_tool("mcp__echo__echo", {"text": "x"})) == "x"
    assert await _everywhere(daemon, home, "echo") == ("trusted", 1)
    assert (await _as_agent(one, "echo"), await _as_agent(two, "echo")) == ("connected", "disconnected")

    routed = await daemon.new_session(mode="bypass", connector="echo")  # a relayed connection counts too
    async with mcp_client(routed) as client:
        assert tool_text(await client.call_tool("echo", {"text": "y"})) == "y"
        assert await _everywhere(daemon, home, "echo") == ("trusted", 2)

    write_user_servers(daemon, {"echo": python_server(ECHO_SERVER, "--changed")})  # edited after trust
    assert await _everywhere(daemon, home, "echo") == ("changed", 0)  # needs trust again; nothing runs
    assert await _as_agent(one, "echo") is None
    await trust(daemon, "echo")
    assert await _everywhere(daemon, home, "echo") == ("trusted", 0)
    await daemon.control("POST", "/control/connectors/echo/untrust")
    assert await _everywhere(daemon, home, "echo") == ("configured", 0)


async def test_a_crash_disconnects_that_session_and_a_crash_loop_puts_it_in_error(
    daemon: Daemon, home: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "crash-from-now-on"
    write_user_servers(
        daemon,
        {"loopy": python_server(FIXTURES / "crash_later.py", env={"CRASH_MARKER": str(marker)}, writes=marker.parent)},
    )
    await trust(daemon, "loopy")
    session = await daemon.new_session(mode="bypass", allow=["*"])
    async with mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__loopy__ping", {})) == "pong"
        assert await _as_agent(session, "loopy") == "connected"
        marker.write_text("")  # from now on every restart dies before it answers
        assert (await client.call_tool("mcp__loopy__crash", {})).is_error
    assert await _as_agent(session, "loopy") == "disconnected"  # no process: crashed, restarting
    assert await _everywhere(daemon, home, "loopy") == ("trusted", 0)

    async def in_error() -> bool:
        return await _as_agent(session, "loopy") == "error"

    await wait_until(in_error, timeout=BOUND, interval=0.2)  # five crashes within a minute
    async with mcp_client(session) as client:
        [loopy] = (await client.call_tool("list_connectors", {})).structured_content["connectors"]  # type: ignore[index]
    assert "crashed 5 times" in loopy["error"]
    assert await _everywhere(daemon, home, "loopy") == ("trusted", 0)  # the connector itself is still trusted


async def test_a_connector_that_starts_fine_but_crashes_on_every_call_reaches_error(daemon: Daemon) -> None:
    # Each restart succeeds, so only the calls' crashes can count towards the loop: a restart that
    # answers initialize must not wipe the crashes before it.
    write_user_servers(daemon, {"echo": python_server(ECHO_SERVER)})
    await trust(daemon, "echo")
    session = await daemon.new_session(mode="bypass", allow=["*"])
    state, crashes = None, 0
    while crashes < 5:
        crashes += 1
        async with mcp_client(session) as client:
            assert (await client.call_tool("mcp__echo__crash", {})).is_error
        async with asyncio.timeout(BOUND):  # restarted after its backoff (connected), or in error
            while (state := await _as_agent(session, "echo")) not in ("connected", "error"):
                await asyncio.sleep(0.1)
        if state == "error":
            break
    assert (crashes, state) == (5, "error")
    async with mcp_client(session) as client:
        [echo] = (await client.call_tool("list_connectors", {})).structured_content["connectors"]  # type: ignore[index]
        refused = await client.call_tool("mcp__echo__echo", {"text": "x"})
    assert "crashed 5 times" in echo["error"]
    assert refused.is_error  # it stays in error: no sixth start


async def test_a_connector_that_would_not_start_stays_in_error_with_its_reason_until_trusted_again(
    daemon: Daemon, home: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.write_text("")
    dying = python_server(FIXTURES / "dying.py", env={"DIE_WHILE": str(broken)}, writes=broken.parent)
    write_user_servers(daemon, {"dying": dying})
    trusted = await daemon.control("POST", "/control/connectors/dying/trust")
    assert trusted["state"] == "error" and "exited with code 7" in trusted["error"]
    # Every surface re-reads the config; the error and its reason stay.
    assert await _everywhere(daemon, home, "dying") == ("error", 0)
    assert "exited with code 7" in (await daemon.control("GET", "/control/connectors/dying"))["error"]
    session = await daemon.new_session(mode="bypass", allow=["*"])
    assert await _as_agent(session, "dying") is None

    # Fixed outside its config (the same trust key), it is still in error until the user trusts it again.
    broken.unlink()
    assert await _everywhere(daemon, home, "dying") == ("error", 0)
    again = await daemon.control("POST", "/control/connectors/dying/trust")
    assert (again["state"], again["error"]) == ("trusted", None)
    listed = json.loads(await cli_output(home, "connectors", "list", "--json"))["connectors"]
    assert {c["id"]: c["state"] for c in listed}["dying"] == "trusted"
