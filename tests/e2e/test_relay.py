"""``/mcp/connectors/<id>`` through the SDK's own client: relayed traffic, policy, and connection lifetimes.

The conformance suite (``tests/conformance``) proves the relay is faithful; these tests cover what it
cannot see: sidecar's policy still holds on the route, each 2025-era MCP session gets a connector
process of its own that ends with it, and 2026-07-28 requests share one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from tests.conftest import Daemon, mcp_client
from tests.helpers import FIXTURES, running, tool_text, trust_user_server, until_running

BOUND = 30.0


@pytest.fixture
async def relayed(daemon: Daemon) -> Daemon:
    await trust_user_server(daemon, "conformance", FIXTURES / "conformance_server.py")
    return daemon


async def test_sampling_logging_and_list_changed_reach_the_client_that_caused_them(relayed: Daemon) -> None:
    session = await relayed.new_session(mode="bypass", connector="conformance")
    prompts: list[str] = []
    logs: list[Any] = []
    changed = asyncio.Event()

    async def on_sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        message = params.messages[0].content
        prompts.append(message.text if isinstance(message, types.TextContent) else "?")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="test-model"
        )

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with mcp_client(
        session, mode="legacy", sampling_callback=on_sampling, logging_callback=on_log, message_handler=on_message
    ) as client:
        sampled = await client.call_tool("test_sampling", {"prompt": "what is six times seven?"})
        assert prompts == ["what is six times seven?"]
        assert "forty-two" in tool_text(sampled)
        logged = await client.call_tool("test_tool_with_logging", {})
        assert not logged.is_error
        assert logs == ["Tool execution started", "Tool processing data", "Tool execution completed"]
        await client.call_tool("test_trigger_tool_change", {})
        await asyncio.wait_for(changed.wait(), BOUND)


async def test_the_sessions_policy_holds_on_the_relay(relayed: Daemon) -> None:
    # Third-party tools the user did not classify are MEDIUM: a read-only session may not see or call them.
    session = await relayed.new_session(mode="read-only", connector="conformance")
    before = relayed.audit_events("tool.call")
    async with mcp_client(session, mode="legacy") as client:
        assert (await client.list_tools()).tools == []
        refused = await client.call_tool("test_simple_text", {})
        assert refused.is_error and tool_text(refused) == "tool not found or not available in this session"
        assert len((await client.list_resources()).resources) > 0  # reading has no side effects: every mode may
    denied = relayed.audit_events("tool.call")[len(before) :]
    assert [(e["tool"], e["decision"], e["outcome"]) for e in denied] == [
        ("mcp__conformance__test_simple_text", "deny", "denied")
    ]
    # A grant that names one tool of the connector reaches that tool, not the connector's resources.
    narrow = await relayed.new_session(
        mode="bypass", allow=["mcp__conformance__test_simple_text"], connector="conformance"
    )
    async with mcp_client(narrow, mode="legacy") as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["test_simple_text"]
        with pytest.raises(MCPError, match="grant does not include conformance"):
            await client.list_resources()


async def test_each_mcp_session_has_its_own_process_until_it_ends(relayed: Daemon) -> None:
    session = await relayed.new_session(mode="bypass", connector="conformance")
    async with mcp_client(session, mode="legacy") as first:
        await until_running(relayed, "conformance", 1)
        async with mcp_client(session, mode="legacy") as second:
            await until_running(relayed, "conformance", 2)
            assert tool_text(await second.call_tool("test_simple_text", {})) == tool_text(
                await first.call_tool("test_simple_text", {})
            )
        await until_running(relayed, "conformance", 1)  # the client's DELETE ended its MCP session and its process
        assert not (await first.call_tool("test_simple_text", {})).is_error
    await until_running(relayed, "conformance", 0)


async def test_2026_requests_share_one_process_that_ends_with_the_sidecar_session(relayed: Daemon) -> None:
    session = await relayed.new_session(mode="bypass", connector="conformance")
    async with mcp_client(session, mode="2026-07-28") as first, mcp_client(session, mode="2026-07-28") as second:
        assert {t.name for t in (await first.list_tools()).tools} >= {"test_simple_text", "test_sampling"}
        await asyncio.gather(
            *(client.call_tool("test_simple_text", {}) for client in (first, second) for _ in range(3))
        )
        assert await running(relayed, "conformance") == 1
    await relayed.control("DELETE", f"/control/sessions/{session['session_id']}")
    await until_running(relayed, "conformance", 0)


async def test_a_relayed_body_naming_a_member_twice_is_refused_before_the_connector_sees_it(relayed: Daemon) -> None:
    session = await relayed.new_session(mode="bypass", connector="conformance")
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call",'
        b'"params":{"name":"test_simple_text","arguments":{}}}'
    )
    headers = {
        **session["headers"],
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    before = relayed.audit_bytes()
    async with aiohttp.ClientSession() as http, http.post(session["url"], data=body, headers=headers) as reply:
        assert reply.status == 400
        error = (await reply.json())["error"]
    assert error["code"] == -32700 and error["data"] == "parse_error"
    assert relayed.audit_bytes() == before, "a refused body was audited"
    assert await running(relayed, "conformance") == 0, "a refused body started the connector"
