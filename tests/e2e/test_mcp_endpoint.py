"""/mcp through the MCP SDK's own client over real HTTP: both protocol eras, SSE and JSON responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from sidecar.config import McpSettings, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import initialize_request, tool_text, wait_until

ERAS = [pytest.param("legacy", id="2025-11-25"), pytest.param("auto", id="2026-07-28")]
EVENT_TIMEOUT = 10.0


@pytest.fixture(params=[False, True], ids=["sse", "json"])
async def any_daemon(request: pytest.FixtureRequest, home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    settings = Settings(mcp=McpSettings(json_response=request.param))
    async with running_daemon(Paths.resolve(), workspace, settings) as d:
        yield d


@pytest.mark.parametrize("mode", ERAS)
async def test_lists_and_calls_builtin_tools_in_both_eras(any_daemon: Daemon, mode: str) -> None:
    session = await any_daemon.new_session()
    async with mcp_client(session, mode=mode) as client:
        expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        assert {"get_current_time", "calculate"} <= names
        calc = next(t for t in listed.tools if t.name == "calculate")
        assert calc.meta is not None and calc.meta["dev.sidecar/risk"] == "LOW"
        assert calc.meta["dev.sidecar/toolControlId"].startswith("tc_")

        result = await client.call_tool("calculate", {"expression": "(2 + 3) * 7 ** 2"})
        assert not result.is_error
        assert tool_text(result) == "245"
        assert result.structured_content == {"result": 245}

    calls = any_daemon.audit_events("tool.call")
    assert [(c["tool"], c["outcome"], c["via"]) for c in calls] == [("calculate", "ok", "mcp")]
    assert b"(2 + 3) * 7" not in any_daemon.audit_bytes()  # argument values are never audited


@pytest.mark.parametrize("mode", ERAS)
async def test_tool_errors_come_back_as_error_results_not_protocol_errors(daemon: Daemon, mode: str) -> None:
    session = await daemon.new_session()
    async with mcp_client(session, mode=mode) as client:
        unknown = await client.call_tool("no_such_tool", {})
        bad_args = await client.call_tool("calculate", {"expression": 12})
        refused = await client.call_tool("calculate", {"expression": "__import__('os').system('true')"})
        huge = await client.call_tool("calculate", {"expression": "9**9**9"})
        bad_zone = await client.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
    for result in (unknown, bad_args, refused, huge, bad_zone):
        assert result.is_error
        text = tool_text(result)
        assert "Traceback" not in text and len(text) < 300
    assert tool_text(unknown) == "tool not found or not available in this session"
    assert "invalid arguments" in tool_text(bad_args)
    assert "result too large" in tool_text(huge)


async def test_extra_arguments_invented_by_a_model_are_dropped(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session) as client:
        result = await client.call_tool("calculate", {"expression": "1+1", "precision": 3})
    assert not result.is_error and tool_text(result) == "2"


async def test_session_grant_limits_what_is_listed_and_callable(daemon: Daemon) -> None:
    session = await daemon.new_session(allow=["get_current_time"])
    async with mcp_client(session) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        denied = await client.call_tool("calculate", {"expression": "1+1"})
    assert names == ["get_current_time"]
    assert denied.is_error
    assert tool_text(denied) == "tool not found or not available in this session"
    [record] = daemon.audit_events("tool.call")
    assert (record["decision"], record["rule"], record["outcome"]) == ("deny", "grant", "denied")


async def test_server_advertises_tools_list_changed(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session, mode="legacy") as client:
        caps = client.server_capabilities
    assert caps.tools is not None and caps.tools.list_changed is True


async def test_legacy_client_gets_list_changed_when_its_grant_changes(daemon: Daemon) -> None:
    session = await daemon.new_session()
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mcp_client(session, mode="legacy", message_handler=on_message) as client:
        assert len((await client.list_tools()).tools) >= 2
        await daemon.control("PATCH", f"/control/sessions/{session['session_id']}", {"allow": ["calculate"]})
        await asyncio.wait_for(changed.wait(), EVENT_TIMEOUT)
        names = [t.name for t in (await client.list_tools(cache_mode="refresh")).tools]
    assert names == ["calculate"]


async def test_modern_client_gets_list_changed_through_listen(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session, mode="auto") as client, client.listen(tools_list_changed=True) as sub:
        await daemon.control(
            "PATCH", f"/control/sessions/{session['session_id']}", {"mode": "read-only", "allow": ["get_current_time"]}
        )
        event = await asyncio.wait_for(anext(aiter(sub)), EVENT_TIMEOUT)
        assert type(event).__name__ == "ToolsListChanged"
        names = [t.name for t in (await client.list_tools(cache_mode="refresh")).tools]
    assert names == ["get_current_time"]


async def test_another_sessions_grant_change_is_not_announced_to_me(daemon: Daemon) -> None:
    mine, other = await daemon.new_session(), await daemon.new_session()
    seen: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            seen.append(message)

    async with mcp_client(mine, mode="legacy", message_handler=on_message) as client:
        await client.list_tools()
        await daemon.control("PATCH", f"/control/sessions/{other['session_id']}", {"allow": ["calculate"]})
        # A change of my own grant is the barrier: once it arrives, any stray one would have too.
        await daemon.control("PATCH", f"/control/sessions/{mine['session_id']}", {"allow": ["*"]})
        await wait_until(lambda: bool(seen), timeout=EVENT_TIMEOUT, interval=0.01)
    assert len(seen) == 1


async def test_transport_session_is_bound_to_the_session_that_opened_it(daemon: Daemon) -> None:
    first, second = await daemon.new_session(), await daemon.new_session()
    init = initialize_request("t")
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.post(daemon.mcp_url, json=init, headers={**first["headers"], **accept}) as r:
            assert r.status == 200
            transport_id = r.headers["mcp-session-id"]
            await r.read()
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        hijack = {**second["headers"], **accept, "mcp-session-id": transport_id, "mcp-protocol-version": "2025-11-25"}
        async with http.post(daemon.mcp_url, json=listing, headers=hijack) as r:
            assert r.status == 404
        own = {**first["headers"], **accept, "mcp-session-id": transport_id, "mcp-protocol-version": "2025-11-25"}
        async with http.delete(daemon.mcp_url, headers=own) as r:
            assert r.status == 200
        async with http.post(daemon.mcp_url, json=listing, headers=own) as r:
            assert r.status == 404
    assert daemon.audit_events("tool.call") == []


async def test_rotated_token_cannot_reuse_a_transport_session(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session, mode="legacy") as client:
        await client.list_tools()
        await daemon.control("POST", "/control/routes/connector-proxy/rotate")
        with pytest.raises((MCPError, ExceptionGroup)):
            await client.list_tools(cache_mode="refresh")
