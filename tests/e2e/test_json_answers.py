"""A 2025-era request is answered with one JSON body unless something must reach the client first.

Raw HTTP on a real in-process daemon: the Content-Type of each answer says which form the daemon chose.
Whatever is addressed to a request before its response (an elicitation, progress, a connector's log
line) turns the answer into the SDK's SSE stream, that message first and the response last, on ``/mcp``
and on a connector's own route alike. 2026-07-28: a quiet ``tools/call`` on ``/mcp`` gets the SDK's JSON
mode.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.helpers import FIXTURES, initialize_request, trust_user_server, unfenced

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def tools_call(request_id: int, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
    """A raw JSON-RPC ``tools/call``; ``params`` adds to its params (``_meta``, say)."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, **params},
    }


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
        body = tools_call(self.ids, name, arguments, **params)
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
    return unfenced(str(response["result"]["content"][0]["text"]))


async def test_a_call_that_runs_without_asking_is_answered_in_json(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session())
    await client.open()
    kind, response = await client.call("calculate", {"expression": "6*7"})
    assert kind.startswith("application/json")
    assert text_of(response) == "42" and response["result"]["structuredContent"] == {"result": 42}
    assert "resultType" not in response["result"]  # shaped for the 2025 era, as the SSE answer is
    calls = daemon.audit_events("tool.call")
    assert [(c["tool"], c["decision"], c["outcome"]) for c in calls] == [("calculate", "allow", "ok")]


async def test_a_progress_token_alone_does_not_open_a_stream(daemon: Daemon, http: aiohttp.ClientSession) -> None:
    client = Legacy(http, daemon, await daemon.new_session())
    await client.open()
    kind, response = await client.call("calculate", {"expression": "1+1"}, _meta={"progressToken": "p1"})
    assert kind.startswith("application/json")  # calculate reports no progress: nothing came before the result
    assert text_of(response) == "2"


async def test_a_call_that_cannot_ask_this_client_is_answered_in_json(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    client = Legacy(http, daemon, await daemon.new_session(mode="default"))
    await client.open()  # declares no elicitation: the approval goes to the user out of band
    kind, response = await client.call("note_save", {"text": "x"})
    assert kind.startswith("application/json")
    assert response["result"]["isError"] and "sidecar approvals allow" in text_of(response)


async def test_an_elicitation_before_the_result_turns_the_answer_into_a_stream(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    client = Legacy(http, daemon, await daemon.new_session(mode="default"))
    opening = initialize_request("asker")
    opening["params"]["capabilities"] = {"elicitation": {"form": {}}}
    async with http.post(client.url, json=opening, headers=client.headers) as r:
        client.headers["mcp-session-id"] = r.headers["mcp-session-id"]
        await r.read()
    client.headers["mcp-protocol-version"] = "2025-11-25"
    async with http.post(
        client.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=client.headers
    ) as r:
        assert r.status == 202
    call = tools_call(2, "note_save", {"text": "kept"})
    async with http.post(client.url, json=call, headers=client.headers) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
        asked = await anext(events)
        assert asked["method"] == "elicitation/create"  # the first message addressed to the call comes first
        answer = {"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept", "content": {"remember": False}}}
        async with http.post(client.url, json=answer, headers=client.headers) as accepted:
            assert accepted.status == 202
        result = await anext(events)
    assert result["id"] == 2 and not result["result"]["isError"], result
    assert [(c["tool"], c["outcome"]) for c in daemon.audit_events("tool.call")] == [("note_save", "ok")]


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE answer, as they arrive."""
    async for line in response.content:
        if line.startswith(b"data:") and line[5:].strip():
            yield json.loads(line[5:])


@pytest.mark.slow
@pytest.mark.parametrize("route", ["bus", "relay"])
async def test_a_connectors_progress_streams_in_order_and_a_quiet_call_is_json(
    daemon: Daemon, http: aiohttp.ClientSession, route: str
) -> None:
    await trust_user_server(daemon, "pid", FIXTURES / "pid_server.py")
    relayed = route == "relay"
    session = await daemon.new_session(
        mode="bypass", allow=["mcp__pid__*"], **({"connector": "pid"} if relayed else {})
    )
    client = Legacy(http, daemon, session)
    client.url = session["url"]
    await client.open()
    tool = "tick" if relayed else "mcp__pid__tick"
    kind, response = await client.call(tool, {"label": "quiet", "steps": 2})
    assert kind.startswith("application/json") and text_of(response) == "quiet"
    body = tools_call(50, tool, {"label": "loud", "steps": 3}, _meta={"progressToken": "t"})
    async with http.post(client.url, json=body, headers=client.headers) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        messages = [message async for message in _events(r)]
    progress = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert [(p["progressToken"], p["progress"], p["message"]) for p in progress] == [
        ("t", 1, "loud"),
        ("t", 2, "loud"),
        ("t", 3, "loud"),
    ]
    assert messages[-1]["id"] == 50 and text_of(messages[-1]) == "loud"  # the response last


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
    body = tools_call(9, "calculate", {"expression": "1"})
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
    body = tools_call(5, "calculate", {"expression": "1"})
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
    body = tools_call(7, name, arguments, _meta=meta)
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
