"""/mcp answers a 2025-era tools/call that will stream nothing with one JSON body, anything else as before.

Raw HTTP on a real in-process daemon: the Content-Type of each answer says which form the daemon chose.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.helpers import initialize_request

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class Legacy:
    """One raw 2025-era MCP session on /mcp."""

    def __init__(self, http: aiohttp.ClientSession, daemon: Daemon, session: dict[str, Any]) -> None:
        self.http, self.url, self.headers = http, daemon.mcp_url, {**session["headers"], **ACCEPT}
        self.ids = 1

    async def open(self) -> str:
        async with self.http.post(self.url, json=initialize_request("raw"), headers=self.headers) as r:
            assert r.status == 200
            transport_id = r.headers["mcp-session-id"]
            await r.read()
        self.headers.update({"mcp-session-id": transport_id, "mcp-protocol-version": "2025-11-25"})
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self.http.post(self.url, json=note, headers=self.headers) as r:
            assert r.status == 202
        return transport_id

    async def call(self, name: str, arguments: dict[str, Any], **params: Any) -> tuple[str, dict[str, Any]]:
        """(the answer's Content-Type, the JSON-RPC response to this request)."""
        self.ids += 1
        body = {
            "jsonrpc": "2.0",
            "id": self.ids,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, **params},
        }
        async with self.http.post(self.url, json=body, headers=self.headers) as r:
            assert r.status == 200
            kind, raw = r.headers["content-type"], await r.read()
            assert r.headers["mcp-session-id"] == self.headers["mcp-session-id"]
        if kind.startswith("application/json"):
            return kind, json.loads(raw)
        events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith(b"data:") and line[5:].strip()]
        return kind, next(e for e in events if e.get("id") == self.ids)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def text_of(response: dict[str, Any]) -> str:
    return str(response["result"]["content"][0]["text"])


async def test_a_call_that_runs_without_asking_is_answered_in_json(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session())
    await client.open()
    kind, response = await client.call("calculate", {"expression": "6*7"})
    assert kind.startswith("application/json")
    assert text_of(response) == "42" and response["result"]["structuredContent"] == {"result": 42}
    assert "resultType" not in response["result"]  # shaped for the 2025 era, as the SSE answer is
    calls = daemon.audit_events("tool.call")
    assert [(c["tool"], c["decision"], c["outcome"]) for c in calls] == [("calculate", "allow", "ok")]


async def test_a_call_with_a_progress_token_still_streams(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session())
    await client.open()
    kind, response = await client.call("calculate", {"expression": "1+1"}, _meta={"progressToken": "p1"})
    assert kind.startswith("text/event-stream")
    assert text_of(response) == "2"


async def test_a_call_that_asks_still_streams(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session(mode="default"))
    await client.open()
    kind, response = await client.call("note_save", {"text": "x"})
    assert kind.startswith("text/event-stream")  # where an elicitation could go, for a client that declares it
    assert response["result"]["isError"] and "sidecar approvals allow" in text_of(response)
    kind, _ = await client.call("tool_call", {"name": "calculate", "arguments": {"expression": "1"}})
    assert kind.startswith("text/event-stream")  # the call it makes may ask


async def test_an_unknown_tool_is_refused_as_before(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session(allow=["calculate"]))
    await client.open()
    _, unknown = await client.call("no_such_tool", {})
    _, denied = await client.call("get_current_time", {})
    assert text_of(unknown) == text_of(denied) and unknown["result"]["isError"]


async def test_another_sessions_transport_gets_404_and_runs_nothing(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    first, second = await daemon.new_session(), await daemon.new_session()
    owner = Legacy(http, daemon, first)
    transport_id = await owner.open()
    thief = {**second["headers"], **ACCEPT, "mcp-session-id": transport_id, "mcp-protocol-version": "2025-11-25"}
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": "calculate", "arguments": {"expression": "1"}},
    }
    async with http.post(daemon.mcp_url, json=body, headers=thief) as r:
        assert r.status == 404
    stale = {**owner.headers, "mcp-session-id": "0" * 32}
    async with http.post(daemon.mcp_url, json=body, headers=stale) as r:
        assert r.status == 404
    assert daemon.audit_events("tool.call") == []


async def test_a_client_that_accepts_only_json_is_refused_as_the_sdk_refuses_it(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    client = Legacy(http, daemon, await daemon.new_session())
    await client.open()
    headers = {**client.headers, "Accept": "application/json"}
    body = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "tools/call",
        "params": {"name": "calculate", "arguments": {"expression": "1"}},
    }
    async with http.post(daemon.mcp_url, json=body, headers=headers) as r:
        assert r.status == 406
    assert daemon.audit_events("tool.call") == []


def modern_call(
    name: str, arguments: dict[str, Any], *, header_name: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """A 2026-07-28 tools/call: (body, headers)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    }
    headers = {
        **ACCEPT,
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": header_name or name,
    }
    return body, headers


async def test_a_modern_quiet_call_is_answered_in_json_through_the_sdks_own_checks(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    session = await daemon.new_session()
    body, headers = modern_call("calculate", {"expression": "6*7"})
    async with http.post(daemon.mcp_url, json=body, headers={**session["headers"], **headers}) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("application/json")
        answer = await r.json()
    assert answer["result"]["content"][0]["text"] == "42" and answer["result"]["resultType"] == "complete"
    assert [c["tool"] for c in daemon.audit_events("tool.call")] == ["calculate"]
    # The era's header ladder still runs: an Mcp-Name that contradicts the body is refused, and nothing runs.
    body, headers = modern_call("calculate", {"expression": "1"}, header_name="get_current_time")
    async with http.post(daemon.mcp_url, json=body, headers={**session["headers"], **headers}) as r:
        assert r.status == 400
        assert "error" in await r.json()
    # A client that takes JSON only is refused as before (the SDK's SSE mode needs both).
    body, headers = modern_call("calculate", {"expression": "1"})
    async with http.post(
        daemon.mcp_url, json=body, headers={**session["headers"], **headers, "Accept": "application/json"}
    ) as r:
        assert r.status == 406
    assert [c["tool"] for c in daemon.audit_events("tool.call")] == ["calculate"]
