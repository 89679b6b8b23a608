"""Refused, unknown and approval-needing calls are well-formed tool results in both eras, on every route.

Each is checked twice: the SDK's own client must parse it (it validates every result against the
negotiated era's schema), and the raw JSON-RPC result on the wire must validate against that era's
wire models, which the SDK generates from the specification's JSON schema
(``mcp_types.methods.validate_server_result``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import pytest
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.methods import validate_server_result

from tests.conftest import Daemon, mcp_client
from tests.helpers import FIXTURES, HTTP_TIMEOUT, initialize_request, tool_text, trust_user_server

pytestmark = pytest.mark.slow  # the relayed connector is a real process

LEGACY: Final = "2025-11-25"
MODERN: Final = "2026-07-28"
ERAS: Final = [pytest.param(LEGACY, id=LEGACY), pytest.param(MODERN, id=MODERN)]
ROUTES: Final = [pytest.param("relay", id="relay"), pytest.param("bus", id="bus")]
NOT_AVAILABLE: Final = "tool not found or not available in this session"
CASES: Final = {
    # what: (session mode, tool on the connector, what the result says)
    "refused": ("read-only", "test_simple_text", NOT_AVAILABLE),
    "unknown": ("bypass", "no_such_tool", NOT_AVAILABLE),
    "approval": ("default", "test_simple_text", "needs the user's approval"),
}


@pytest.fixture
async def relayed(daemon: Daemon) -> Daemon:
    await trust_user_server(daemon, "conformance", FIXTURES / "conformance_server.py")
    return daemon


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("version", ERAS)
async def test_refusals_are_tool_results_the_eras_client_and_schema_accept(
    relayed: Daemon, route: str, version: str
) -> None:
    for what, (mode, tool, says) in CASES.items():
        if route == "relay":  # the connector's own route, where tools keep their own names
            session, name = await relayed.new_session(mode=mode, connector="conformance"), tool
        else:
            session = await relayed.new_session(mode=mode, allow=["mcp__conformance__*"])
            name = f"mcp__conformance__{tool}"
        async with mcp_client(session, mode="legacy" if version == LEGACY else MODERN) as client:
            parsed = await client.call_tool(name, {})
        assert parsed.is_error and says in tool_text(parsed), what

        wire = await _raw_call(session, name, version)
        validate_server_result("tools/call", version, wire)  # raises on a shape the era does not allow
        assert wire["isError"] is True and says in wire["content"][0]["text"], what
        if version == MODERN:
            assert wire["resultType"] == "complete", what  # required at 2026-07-28


# -- a raw JSON-RPC client, to see the result exactly as it travels -------------------------------------


async def _raw_call(session: Mapping[str, Any], name: str, version: str) -> dict[str, Any]:
    """``tools/call`` of ``name`` with no arguments, as a client of ``version`` sends it; the raw result."""
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": {}}}
    headers = {
        **session["headers"],
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
        if version == MODERN:  # one self-contained request: routing headers and the _meta envelope
            call["params"]["_meta"] = {PROTOCOL_VERSION_META_KEY: version, CLIENT_CAPABILITIES_META_KEY: {}}
            headers |= {"MCP-Protocol-Version": version, "Mcp-Method": "tools/call", "Mcp-Name": name}
            return await _post(http, session["url"], headers, call)
        async with http.post(session["url"], json=initialize_request("raw", protocol=version), headers=headers) as r:
            assert r.status == 200, await r.text()
            headers |= {"Mcp-Session-Id": r.headers["Mcp-Session-Id"], "MCP-Protocol-Version": version}
            await r.read()
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(session["url"], json=initialized, headers=headers) as r:
            assert r.status == 202, await r.text()
        try:
            return await _post(http, session["url"], headers, call)
        finally:
            async with http.delete(session["url"], headers=headers):
                pass


async def _post(
    http: aiohttp.ClientSession, url: str, headers: Mapping[str, str], message: Mapping[str, Any]
) -> dict[str, Any]:
    async with http.post(url, json=message, headers=headers) as response:
        body = await response.text()
        assert response.status == 200, body
        kind = response.headers.get("Content-Type", "")
    messages = [json.loads(body)] if kind.startswith("application/json") else _sse_messages(body)
    [answer] = [m for m in messages if m.get("id") == message["id"]]
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


def _sse_messages(body: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body (each event's ``data:`` lines joined)."""
    found = []
    for event in body.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
        if data:
            found.append(json.loads(data))
    return found
