"""Who may use a connector, through the real daemon on every path and in both protocol eras (issue 10, 1, 2, 4).

A session created without ``--allow`` may use the built-ins and no connector tool, even one trusted later;
a connector tool needs the network unless its connector works offline; and an agent is told only what its
grant allows: ``tools/list``, ``tool_search``, ``tool_call``, ``list_connectors``, the server's
instructions, the ``tool_search`` description, the REST facade and a connector's own route all agree.
Connectors are real MCP servers in real subprocesses (``tests/connectors/fixtures``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from sidecar.config import SessionSettings, Settings, ToolSettings
from sidecar.paths import Paths
from tests.conftest import Daemon, cli_output, mcp_client, running_daemon
from tests.helpers import (
    ECHO_SERVER,
    FIXTURES,
    child_pids,
    python_server,
    rest,
    tool_text,
    trust,
    wait_until,
    write_user_servers,
)

pytestmark = pytest.mark.slow  # every test trusts a connector: a probe process at least

ERAS: Final = ("legacy", "2026-07-28")
NOT_AVAILABLE: Final = "tool not found or not available in this session"
HIDDEN: Final = "Measure the tide in the harbour of Zq9."
"""The description of the tool of ``quokka``, a connector the sessions under test may not use."""
ECHO_DESCRIPTION: Final = "Return the text unchanged."
QUERIES: Final = ("tide harbour measure", "quokka", "zephyr", "echo text unchanged", "fetch", "sleep crash argv")


def _quokka(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    description = tmp_path / "quokka-description.txt"
    description.write_text(HIDDEN)
    return {
        **python_server(
            FIXTURES / "drifting_server.py", env={"DRIFT_FILE": str(description)}, writes=description.parent
        ),
        **extra,
    }


def _messages(exc: BaseException) -> str:
    """Every message in an exception and the groups the SDK client wraps it in."""
    if isinstance(exc, BaseExceptionGroup):
        return " | ".join(_messages(inner) for inner in exc.exceptions)
    return str(exc)


async def _agent_view(daemon: Daemon, session: dict[str, Any], era: str) -> str:
    """Everything an agent of ``session`` can read about the pool: instructions, the tool list (descriptions
    included), search results, ``list_connectors``, resources, prompts, and the REST facade's list."""
    seen: list[str] = []
    async with mcp_client(session, mode=era) as client:
        seen.append(client.instructions or "")
        seen.append((await client.list_tools()).model_dump_json())
        for query in QUERIES:
            found = await client.call_tool("tool_search", {"query": query, "limit": 50})
            seen.append(tool_text(found) + json.dumps(found.structured_content))
        connectors = await client.call_tool("list_connectors", {})
        seen.append(tool_text(connectors) + json.dumps(connectors.structured_content))
        seen.append((await client.list_resources()).model_dump_json())
        seen.append((await client.list_prompts()).model_dump_json())
    status, listing = await rest(daemon, "GET", "/api/v1/mcp/tools", session["headers"])
    assert status == 200
    seen.append(json.dumps(listing))
    return "\n".join(seen)


async def _calls(session: dict[str, Any], era: str, tool: str) -> list[str]:
    """The text of one call of ``tool`` made directly and through ``tool_call``."""
    async with mcp_client(session, mode=era) as client:
        direct = await client.call_tool(tool, {"text": "hi"})
        deferred = await client.call_tool("tool_call", {"name": tool, "arguments": {"text": "hi"}})
    return [tool_text(direct), tool_text(deferred)]


def _borrowing(routed: dict[str, Any], session: dict[str, Any]) -> dict[str, Any]:
    """A connector's own route and token (from ``routed``), with another session's envelope."""
    headers = {**routed["headers"], "X-Sidecar-Context": session["headers"]["X-Sidecar-Context"]}
    return {"url": routed["url"], "headers": headers}


async def _refused_on_its_route(client_session: dict[str, Any], connector: str) -> None:
    """Both eras are refused on the connector's own route, and no process of it starts."""
    before = child_pids()
    for era in ERAS:
        with pytest.raises(BaseException) as refused:  # the SDK client wraps the error in exception groups
            async with mcp_client(client_session, mode=era) as client:
                await client.list_tools()
        assert f"this session may not use connector {connector}" in _messages(refused.value), era
    assert child_pids() == before


# -- item 1: no grant, no connector tools -----------------------------------------------------------------


async def test_a_session_without_a_grant_never_sees_or_runs_a_connector_even_one_trusted_later(
    daemon: Daemon, tmp_path: Path
) -> None:
    write_user_servers(daemon, {"zephyr": python_server(ECHO_SERVER), "quokka": _quokka(tmp_path)})
    plain = await daemon.new_session(mode="bypass")  # no allow: what `session new` gives without --allow
    everything = await daemon.new_session(mode="bypass", allow=["*"])  # the user's own choice
    assert plain["session"]["allow"] == ["builtin:*"] and everything["session"]["allow"] == ["*"]
    await trust(daemon, "zephyr")
    await trust(daemon, "quokka")

    for era in ERAS:
        seen = await _agent_view(daemon, plain, era)
        for leak in ("zephyr", "quokka", HIDDEN, ECHO_DESCRIPTION):
            assert leak not in seen, (era, leak)
        assert "calculate" in seen  # the built-ins its mode allows
        assert await _calls(plain, era, "mcp__zephyr__echo") == [NOT_AVAILABLE, NOT_AVAILABLE], era
        async with mcp_client(plain, mode=era) as client:
            assert tool_text(await client.call_tool("calculate", {"expression": "6*7"})) == "42"
    for tool in ("mcp__zephyr__echo", "mcp__nonesuch__echo"):  # outside the grant answers as missing
        status, _ = await rest(daemon, "POST", f"/api/v1/mcp/tools/{tool}/invoke", plain["headers"], {})
        assert status == 404, tool

    # The connector's own route, with its token and this session's envelope: refused before anything runs.
    routed = await daemon.new_session(mode="bypass", connector="zephyr")  # --connector is a grant of zephyr
    assert routed["session"]["allow"] == ["mcp__zephyr__*"]
    await _refused_on_its_route(_borrowing(routed, plain), "zephyr")
    for era in ERAS:
        async with mcp_client(routed, mode=era) as client:
            assert tool_text(await client.call_tool("echo", {"text": era})) == era

    # `*` was the user's choice: the connectors trusted after the session was made are in it.
    for era in ERAS:
        seen = await _agent_view(daemon, everything, era)
        assert "mcp__zephyr__echo" in seen and HIDDEN in seen, era
        assert await _calls(everything, era, "mcp__zephyr__echo") == ["hi", "hi"], era


async def test_session_new_without_allow_grants_the_built_ins_only_and_its_help_says_so(
    daemon: Daemon, home: Path
) -> None:
    write_user_servers(daemon, {"zephyr": python_server(ECHO_SERVER)})
    await trust(daemon, "zephyr")
    raw, connector, helped = await asyncio.gather(
        cli_output(home, "session", "new", "--workspace", str(daemon.workspace), "--mode", "bypass"),
        cli_output(home, "session", "new", "--workspace", str(daemon.workspace), "--connector", "zephyr"),
        cli_output(home, "session", "new", "--help"),
    )
    created = json.loads(raw)
    granted = {s["session_id"]: s["allow"] for s in json.loads(await cli_output(home, "session", "list", "--json"))}
    assert granted[created["session_id"]] == ["builtin:*"]
    assert granted[json.loads(connector)["session_id"]] == ["mcp__zephyr__*"]
    assert await _calls(created, "legacy", "mcp__zephyr__echo") == [NOT_AVAILABLE, NOT_AVAILABLE]
    help_text = " ".join(helped.split())
    assert "Without --allow: the built-ins the mode allows and no connector tool" in help_text
    assert "default_allow" in help_text and "mcp__<id>__*" in help_text


async def test_the_default_grant_is_the_users_setting(home: Path, workspace: Path) -> None:
    settings = Settings(sessions=SessionSettings(default_allow=("builtin:*", "mcp__zephyr__*")))
    async with running_daemon(Paths.resolve(), workspace, settings) as daemon:
        write_user_servers(daemon, {"zephyr": python_server(ECHO_SERVER)})
        await trust(daemon, "zephyr")
        session = await daemon.new_session(mode="bypass")
        assert session["session"]["allow"] == ["builtin:*", "mcp__zephyr__*"]
        for era in ERAS:
            assert await _calls(session, era, "mcp__zephyr__echo") == ["hi", "hi"], era


# -- item 2: the network ----------------------------------------------------------------------------------


async def test_without_the_network_a_session_sees_and_runs_only_connectors_that_work_offline(
    daemon: Daemon,
) -> None:
    write_user_servers(
        daemon,
        {"zephyr": python_server(ECHO_SERVER), "quokka": {**python_server(ECHO_SERVER), "sidecarNetwork": False}},
    )
    for connector in ("zephyr", "quokka", "workspace"):  # workspace: a package whose connector.json says offline
        await trust(daemon, connector)
    offline = await daemon.new_session(mode="bypass", allow=["*"], network=False)
    online = await daemon.new_session(mode="bypass", allow=["*"])

    for era in ERAS:
        seen = await _agent_view(daemon, offline, era)
        assert "zephyr" not in seen, era
        assert "mcp__quokka__echo" in seen and "mcp__workspace__list_files" in seen, era
        assert await _calls(offline, era, "mcp__zephyr__echo") == [NOT_AVAILABLE, NOT_AVAILABLE], era
        assert await _calls(offline, era, "mcp__quokka__echo") == ["hi", "hi"], era
        assert await _calls(online, era, "mcp__zephyr__echo") == ["hi", "hi"], era
    for tool, status in (("mcp__zephyr__echo", 404), ("mcp__quokka__echo", 200)):
        answer, body = await rest(
            daemon, "POST", f"/api/v1/mcp/tools/{tool}/invoke", offline["headers"], {"arguments": {"text": "x"}}
        )
        assert answer == status, (tool, body)

    # Its own route: a session without the network is refused by zephyr's, served by quokka's.
    await _refused_on_its_route(await daemon.new_session(mode="bypass", connector="zephyr", network=False), "zephyr")
    routed = await daemon.new_session(mode="bypass", connector="quokka", network=False)
    for era in ERAS:
        async with mcp_client(routed, mode=era) as client:
            assert tool_text(await client.call_tool("echo", {"text": era})) == era

    # Declaring a connector offline widens who may use it, so it needs trust again.
    write_user_servers(
        daemon,
        {
            "zephyr": {**python_server(ECHO_SERVER), "sidecarNetwork": False},
            "quokka": {**python_server(ECHO_SERVER), "sidecarNetwork": False},
        },
    )
    states = {c["id"]: c["state"] for c in (await daemon.control("GET", "/control/connectors"))["connectors"]}
    assert states["zephyr"] == "changed" and states["quokka"] == "trusted"
    assert await _calls(offline, "legacy", "mcp__zephyr__echo") == [NOT_AVAILABLE, NOT_AVAILABLE]


# -- item 4: what an agent sees, and how it reaches deferred tools --------------------------------------------


async def test_connector_tools_are_deferred_and_the_hint_names_only_what_the_grant_allows(
    daemon: Daemon, tmp_path: Path
) -> None:
    write_user_servers(daemon, {"zephyr": python_server(ECHO_SERVER), "quokka": _quokka(tmp_path)})
    await trust(daemon, "zephyr")
    await trust(daemon, "quokka")
    session = await daemon.new_session(mode="bypass", allow=["builtin:*", "mcp__zephyr__*"])
    neighbour = await daemon.new_session(mode="bypass", allow=["*"])

    async with mcp_client(session, mode="legacy") as client:  # instructions come with initialize ...
        legacy_instructions = client.instructions or ""
    async with mcp_client(session, mode="auto") as client:  # ... and with server/discover (2026-07-28)
        modern_instructions = client.instructions or ""
    for instructions in (legacy_instructions, modern_instructions):
        assert "tool_search" in instructions and "zephyr (6 tools)" in instructions, instructions
        assert f"mcp__zephyr__echo: {ECHO_DESCRIPTION}" in instructions
        assert "quokka" not in instructions and HIDDEN not in instructions

    for era in ERAS:
        async with mcp_client(session, mode=era) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            assert not any(name.startswith("mcp__") for name in listed), era  # deferred by default
            search = listed["tool_search"].description or ""
            assert "mcp__zephyr__echo" in search and "quokka" not in search, era
            found = await client.call_tool("tool_search", {"query": "echo text unchanged"})
            assert [t["name"] for t in found.structured_content["tools"]][:1] == ["mcp__zephyr__echo"]  # type: ignore[index]
            ran = await client.call_tool("tool_call", {"name": "mcp__zephyr__echo", "arguments": {"text": era}})
            assert tool_text(ran) == era
            connectors = (await client.call_tool("list_connectors", {})).structured_content
        [zephyr] = connectors["connectors"]  # type: ignore[index]
        assert set(zephyr) == {"id", "name", "description", "state", "error", "tools"}  # no other session's counts
        assert (zephyr["id"], zephyr["state"]) == ("zephyr", "connected")
        assert {t.removeprefix("mcp__zephyr__") for t in zephyr["tools"]} == {
            "echo",
            "crash",
            "sleep",
            "sleep_logged",
            "env_keys",
            "argv",
        }

    # Another session with the grant of both sees both, and zephyr as its own (no process yet), whatever
    # the first session runs.
    async with mcp_client(neighbour) as client:
        found = (await client.call_tool("list_connectors", {})).structured_content
    assert {c["id"]: c["state"] for c in found["connectors"]} == {"quokka": "disconnected", "zephyr": "disconnected"}  # type: ignore[index]

    # The grant is checked again when the deferred tool runs: found, then revoked, then called.
    async with mcp_client(session) as client:
        await client.call_tool("tool_search", {"query": "echo"})
        await daemon.control("PATCH", f"/control/sessions/{session['session_id']}", {"allow": ["builtin:*"]})
        revoked = await client.call_tool("tool_call", {"name": "mcp__zephyr__echo", "arguments": {"text": "x"}})
        gone = (await client.call_tool("list_connectors", {})).structured_content
    assert tool_text(revoked) == NOT_AVAILABLE and gone == {"connectors": []}


@pytest.fixture
async def listing_daemon(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    settings = Settings(tools=ToolSettings(direct_connectors=("zephyr",)))
    async with running_daemon(Paths.resolve(), workspace, settings) as daemon:
        yield daemon


async def test_a_connector_may_be_listed_directly_by_the_user_or_by_its_own_declaration(
    listing_daemon: Daemon,
) -> None:
    echo = python_server(ECHO_SERVER)
    servers = {
        "zephyr": echo,  # direct_connectors names it
        "quokka": {**echo, "defer_loading": False},  # it says so itself
        "otter": {**echo, "defer_loading": ["sleep", "sleep_logged"]},  # it defers only these
        "plain": echo,  # says nothing: deferred
    }
    write_user_servers(listing_daemon, servers)
    for connector in ("zephyr", "quokka", "otter", "plain"):
        await trust(listing_daemon, connector)
    session = await listing_daemon.new_session(mode="bypass", allow=["*"])
    for era in ERAS:
        async with mcp_client(session, mode=era) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            found = await client.call_tool("tool_search", {"query": "sleep echo", "limit": 50})
        searched = {t["name"] for t in found.structured_content["tools"]}  # type: ignore[index]
        for name in ("mcp__zephyr__echo", "mcp__quokka__sleep", "mcp__otter__echo"):
            assert name in listed and name not in searched, (era, name)
        for name in ("mcp__otter__sleep", "mcp__plain__echo", "mcp__plain__sleep"):
            assert name not in listed and name in searched, (era, name)

    # Deferral is no permission: a connector that changes its mind keeps its trust, its tools move.
    write_user_servers(listing_daemon, {**servers, "quokka": {**echo, "defer_loading": True}})
    async with mcp_client(session) as client:

        async def quokka_deferred() -> bool:
            return "mcp__quokka__sleep" not in {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}

        await wait_until(quokka_deferred)
    states = {c["id"]: c["state"] for c in (await listing_daemon.control("GET", "/control/connectors"))["connectors"]}
    assert states["quokka"] == "trusted"


async def test_defer_connectors_false_lists_every_connector_tool(home: Path, workspace: Path) -> None:
    settings = Settings(tools=ToolSettings(defer_connectors=False))
    async with running_daemon(Paths.resolve(), workspace, settings) as daemon:
        write_user_servers(daemon, {"zephyr": python_server(ECHO_SERVER)})
        await trust(daemon, "zephyr")
        session = await daemon.new_session(mode="bypass", allow=["*"])
        async with mcp_client(session, mode="2026-07-28") as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            assert "Deferred tools" not in (
                next(t for t in (await client.list_tools()).tools if t.name == "tool_search").description or ""
            )
    assert {"mcp__zephyr__echo", "mcp__zephyr__sleep"} <= listed
