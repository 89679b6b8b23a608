"""Revoking a route or ending a session aborts everything in flight on it (contract §4)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.paths import Paths
from tests.conftest import Daemon, running_daemon
from tests.helpers import initialize_request

ABORT_BOUND = 10.0
"""Fail-safe bound on how long an aborted request may take to end (not a timing assertion)."""
SLOW_CALLS = 10


class SlowTool:
    """A tool that blocks until cancelled, counting starts and cancellations."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.all_started = asyncio.Event()

    async def __call__(self, arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        self.started += 1
        if self.started >= SLOW_CALLS:
            self.all_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return ToolOutput(text="unreachable")


@pytest.fixture
def slow() -> SlowTool:
    return SlowTool()


@pytest.fixture
async def slow_daemon(home: Path, workspace: Path, slow: SlowTool) -> AsyncIterator[Daemon]:
    registry = ToolRegistry()
    registry.add(name="wait_forever", description="Blocks until aborted.", risk=Risk.LOW, handler=slow)
    async with running_daemon(Paths.resolve(), workspace, registry=registry) as d:
        yield d


def _modern_call(name: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": {}, "_meta": meta}}
    return (
        {
            **headers,
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        },
        json.dumps(body).encode(),
    )


async def _open_get_stream(http: aiohttp.ClientSession, daemon: Daemon, headers: dict[str, str]) -> Any:
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = initialize_request("t")
    async with http.post(daemon.mcp_url, json=init, headers={**headers, **accept}) as r:
        assert r.status == 200
        transport_id = r.headers["mcp-session-id"]
        await r.read()
    common = {**headers, "mcp-session-id": transport_id, "mcp-protocol-version": "2025-11-25"}
    async with http.post(
        daemon.mcp_url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**common, **accept}
    ) as r:
        assert r.status == 202
    stream = await http.get(daemon.mcp_url, headers={**common, "Accept": "text/event-stream"})
    assert stream.status == 200
    return stream


async def _until_ended(call: Any) -> str:
    """Await a request; return how it ended: 'ended' for EOF or a dropped connection, 'aborted' for the
    403 that answers a request aborted before its answer began (its JSON-RPC error, for its own id)."""
    try:
        response = await call
        body = await response.read()
    except (aiohttp.ClientError, ConnectionError):
        return "ended"
    if response.status == 403 and response.content_type == "application/json":
        answer = json.loads(body)
        if (
            answer.get("id") == 1
            and answer.get("error", {}).get("code") == -32600
            and "aborted" in answer["error"]["message"]
        ):
            return "aborted"
    return f"answered {response.status}"


async def _revoke_while_busy(daemon: Daemon, slow: SlowTool, session: dict[str, Any], revoke: Any) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        stream = await _open_get_stream(http, daemon, session["headers"])
        calls = []
        for _ in range(SLOW_CALLS):
            headers, body = _modern_call("wait_forever", session["headers"])
            calls.append(asyncio.create_task(_until_ended(http.post(daemon.mcp_url, data=body, headers=headers))))
        await asyncio.wait_for(slow.all_started.wait(), ABORT_BOUND)

        async def stream_end() -> str:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await stream.content.read()  # returns only at EOF
            return "ended"

        stream_task = asyncio.create_task(stream_end())
        await revoke()
        async with asyncio.timeout(ABORT_BOUND):
            outcomes = await asyncio.gather(*calls, stream_task)
        stream.release()
    return outcomes


async def test_rotating_a_route_aborts_its_calls_and_streams_and_kills_the_old_token(
    slow_daemon: Daemon, slow: SlowTool
) -> None:
    session = await slow_daemon.new_session()
    outcomes = await _revoke_while_busy(
        slow_daemon,
        slow,
        session,
        lambda: slow_daemon.control("POST", "/control/routes/connector-proxy/rotate"),
    )
    assert outcomes == ["aborted"] * SLOW_CALLS + ["ended"]  # the calls, then the GET stream
    assert slow.cancelled == SLOW_CALLS  # the tool executions were cancelled, not just the HTTP side
    async with aiohttp.ClientSession() as http:
        headers, body = _modern_call("calculate", session["headers"])
        async with http.post(slow_daemon.mcp_url, data=body, headers=headers) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
    aborted = [c for c in slow_daemon.audit_events("tool.call") if c["tool"] == "wait_forever"]
    assert [c["outcome"] for c in aborted] == ["aborted"] * SLOW_CALLS


async def test_ending_a_session_aborts_its_calls_and_streams_and_kills_its_envelope(
    slow_daemon: Daemon, slow: SlowTool
) -> None:
    session = await slow_daemon.new_session()
    bystander = await slow_daemon.new_session()
    outcomes = await _revoke_while_busy(
        slow_daemon,
        slow,
        session,
        lambda: slow_daemon.control("DELETE", f"/control/sessions/{session['session_id']}"),
    )
    assert outcomes == ["aborted"] * SLOW_CALLS + ["ended"]
    assert slow.cancelled == SLOW_CALLS
    async with aiohttp.ClientSession() as http:
        headers, body = _modern_call("calculate", session["headers"])
        async with http.post(slow_daemon.mcp_url, data=body, headers=headers) as r:
            assert r.status == 403
        headers, body = _modern_call("calculate", bystander["headers"])
        async with http.post(slow_daemon.mcp_url, data=body, headers=headers) as r:
            assert r.status == 200  # another session on the same route is untouched


async def test_ending_a_session_aborts_its_rest_invocation_which_answers_aborted(
    slow_daemon: Daemon, slow: SlowTool
) -> None:
    # REST runs the tool in aiohttp's own request task: revocation must end the tool and still let
    # that task answer, and the server must carry on serving.
    session = await slow_daemon.new_session()
    url = slow_daemon.url + "/api/v1/mcp/tools/wait_forever/invoke"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        invoke = asyncio.create_task(http.post(url, json={"arguments": {}}, headers=session["headers"]))
        async with asyncio.timeout(ABORT_BOUND):
            while slow.started < 1:
                await asyncio.sleep(0.01)
            await slow_daemon.control("DELETE", f"/control/sessions/{session['session_id']}")
            response = await invoke
            answer = await response.json()

        assert (response.status, answer["status"], slow.cancelled) == (200, "aborted", 1)
        other = await slow_daemon.new_session()
        calc = slow_daemon.url + "/api/v1/mcp/tools/calculate/invoke"
        async with http.post(calc, json={"arguments": {"expression": "6*7"}}, headers=other["headers"]) as r:
            assert (r.status, (await r.json())["status"]) == (200, "ok")
    outcomes = [(c["tool"], c["outcome"]) for c in slow_daemon.audit_events("tool.call")]
    assert outcomes == [("wait_forever", "aborted"), ("calculate", "ok")]
