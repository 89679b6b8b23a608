"""The tool pool, end to end: one decision on every path (contract §6), asserted against a table.

Tools under test are registered at the registry seam (a real daemon, real HTTP, the SDK's client):
``low_tool`` (LOW), ``medium_tool`` (MEDIUM), ``high_tool`` (HIGH), ``paid_tool`` (LOW but listed as
billable), ``net_tool`` (LOW, needs network). All are deferred, so ``tool_search`` and ``tool_call``
reach them, while direct ``tools/call`` and REST invoke reach them by name.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.config import Settings, ToolSettings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import rest, tool_text

MATRIX_TOOLS = ("low_tool", "medium_tool", "high_tool", "paid_tool", "net_tool")
NOT_AVAILABLE = "tool not found or not available in this session"


class Counter:
    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def tool(self, name: str) -> Any:
        async def handler(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
            self.runs[name] = self.runs.get(name, 0) + 1
            await asyncio.sleep(0)  # let parallel callers interleave
            return ToolOutput(text=f"{name} ran", structured={"n": arguments.get("n")})

        return handler


def _registry(counter: Counter) -> ToolRegistry:
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for name, risk, network in [
        ("low_tool", Risk.LOW, False),
        ("medium_tool", Risk.MEDIUM, False),
        ("high_tool", Risk.HIGH, False),
        ("paid_tool", Risk.LOW, False),
        ("net_tool", Risk.LOW, True),
        ("paid_images_b", Risk.LOW, False),
        ("paid_video", Risk.LOW, False),
    ]:
        registry.add(
            name=name,
            description=f"The {name.replace('_', ' ')} for pool tests.",
            risk=risk,
            handler=counter.tool(name),
            parameters=schema,
            needs_network=network,
        )
    return registry


MANIFEST = {
    "version": 1,
    "tools": {
        "paid_tool": {"approvalKind": "image-generation", "group": "images"},
        "paid_images_b": {"approvalKind": "image-generation", "group": "images"},
        "paid_video": {"approvalKind": "video-generation", "group": "video"},
    },
}


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "high-credit-tools.json"
    path.write_text(json.dumps(MANIFEST))
    path.chmod(0o600)
    return path


@pytest.fixture
async def pool(home: Path, workspace: Path, counter: Counter, manifest: Path) -> AsyncIterator[Daemon]:
    settings = Settings(
        tools=ToolSettings(defer=(*MATRIX_TOOLS, "paid_images_b", "paid_video"), billing_manifest=str(manifest))
    )
    async with running_daemon(Paths.resolve(), workspace, settings, registry=_registry(counter)) as d:
        yield d


# The table: (mode, tool, granted?, network?) -> expected verdict. "allow" runs, "ask" needs approval,
# "deny" is indistinguishable from a missing tool.
def expected(mode: str, tool: str, granted: bool, network: bool) -> str:
    if tool == "high_tool" or not granted:
        return "deny"
    if tool == "net_tool" and not network:
        return "deny"
    if tool == "medium_tool":
        return {"read-only": "deny", "default": "ask", "bypass": "allow"}[mode]
    if tool == "paid_tool":
        return "ask"  # billable asks in every mode, bypass included
    return "allow"


CASES = [
    (mode, granted, network)
    for mode in ("read-only", "default", "bypass")
    for granted in (True, False)
    for network in (True, False)
]


def _verdict_of_mcp(result: types.CallToolResult) -> str:
    if not result.is_error:
        return "allow"
    text = tool_text(result)
    if text == NOT_AVAILABLE:
        return "deny"
    assert "needs the user's approval" in text and "sidecar approvals allow ap_" in text, text
    return "ask"


@pytest.mark.parametrize(("mode", "granted", "network"), CASES)
async def test_policy_matrix_is_the_same_on_every_path(
    pool: Daemon, counter: Counter, mode: str, granted: bool, network: bool
) -> None:
    allow = ["*"] if granted else ["calculate", "tool_search", "tool_call"]
    session = await pool.new_session(mode=mode, allow=allow, network=network)
    table = {tool: expected(mode, tool, granted, network) for tool in MATRIX_TOOLS}
    visible = {tool for tool, verdict in table.items() if verdict != "deny"}

    status, listing = await rest(pool, "GET", "/api/v1/mcp/tools", session["headers"])
    assert status == 200
    assert {t["name"] for t in listing["tools"]} & set(MATRIX_TOOLS) == visible

    async with mcp_client(session, mode="legacy") as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert not listed & set(MATRIX_TOOLS), "deferred tools stay out of tools/list"
        assert {"tool_search", "tool_call"} <= listed
        for tool, verdict in table.items():
            found = await client.call_tool("tool_search", {"query": tool.replace("_", " "), "limit": 10})
            names = [t["name"] for t in (found.structured_content or {}).get("tools", [])]
            assert (tool in names) == (verdict != "deny"), (tool, names)
            direct = await client.call_tool(tool, {"n": 1})
            assert _verdict_of_mcp(direct) == verdict, (tool, "tools/call", tool_text(direct))
            deferred = await client.call_tool("tool_call", {"name": tool, "arguments": {"n": 1}})
            assert _verdict_of_mcp(deferred) == verdict, (tool, "tool_call", tool_text(deferred))

    for tool, verdict in table.items():
        status, body = await rest(
            pool, "POST", f"/api/v1/mcp/tools/{tool}/invoke", session["headers"], {"arguments": {"n": 1}}
        )
        if verdict == "deny":
            # Outside the grant or the network: as missing (404); HIGH or not for this mode: forbidden (403).
            hidden = tool != "high_tool" and (not granted or (tool == "net_tool" and not network))
            assert status == (404 if hidden else 403), (tool, body)
        else:
            assert status == 200 and body["status"] == ("ok" if verdict == "allow" else "approval_required")

    runs_expected = {tool: 3 for tool, verdict in table.items() if verdict == "allow"}
    assert counter.runs == runs_expected  # tools/call + tool_call + REST each ran once; nothing else ran
    assert "high_tool" not in json.dumps(listing)


async def test_search_never_finds_high_or_disallowed_tools(pool: Daemon) -> None:
    session = await pool.new_session(mode="bypass", allow=["low_tool", "tool_search", "tool_call"])
    async with mcp_client(session) as client:
        found = await client.call_tool("tool_search", {"query": "tool pool tests high medium paid net low"})
    names = [t["name"] for t in (found.structured_content or {})["tools"]]
    assert names == ["low_tool"]
    assert (found.structured_content or {})["tools"][0]["inputSchema"]["properties"] == {"n": {"type": "integer"}}


async def test_schema_loaded_then_grant_revoked_then_tool_call_is_denied(pool: Daemon, counter: Counter) -> None:
    session = await pool.new_session(mode="bypass")
    async with mcp_client(session) as client:
        found = await client.call_tool("tool_search", {"query": "low tool"})
        assert "low_tool" in [t["name"] for t in (found.structured_content or {})["tools"]]
        await pool.control("PATCH", f"/control/sessions/{session['session_id']}", {"allow": ["tool_call"]})
        result = await client.call_tool("tool_call", {"name": "low_tool", "arguments": {}})
    assert tool_text(result) == NOT_AVAILABLE
    assert counter.runs == {}


async def test_medium_tool_pending_approval_resolved_by_the_control_api_runs_once(
    pool: Daemon, counter: Counter
) -> None:
    session = await pool.new_session(mode="default")
    async with mcp_client(session) as client:
        first = await client.call_tool("medium_tool", {"n": 7})
        assert _verdict_of_mcp(first) == "ask"
        [pending] = (await pool.control("GET", "/control/approvals"))["approvals"]
        assert (pending["tool"], pending["kind"], pending["state"]) == ("medium_tool", "confirm", "pending")
        assert pending["approval_id"] in tool_text(first)
        await pool.control("POST", f"/control/approvals/{pending['approval_id']}/allow", {})

        other_args = await client.call_tool("medium_tool", {"n": 8})  # not the approved arguments
        assert _verdict_of_mcp(other_args) == "ask"
        retry = await client.call_tool("medium_tool", {"n": 7})
        assert not retry.is_error and tool_text(retry) == "medium_tool ran"
        replay = await client.call_tool("medium_tool", {"n": 7})
        assert _verdict_of_mcp(replay) == "ask"  # single use
    assert counter.runs == {"medium_tool": 1}
    events = [r["event"] for r in pool.audit_events() if r["event"].startswith("approval.")]
    assert events[:3] == ["approval.requested", "approval.allowed", "approval.requested"]
    assert "approval.used" in events
    calls = [(r["tool"], r["decision"], r["rule"], r["outcome"], r["grant"]) for r in pool.audit_events("tool.call")]
    assert ("medium_tool", "ask", "confirm", "ok", "approved") in calls


async def test_fifty_parallel_retries_of_one_approval_run_the_tool_once(pool: Daemon, counter: Counter) -> None:
    session = await pool.new_session(mode="default")
    async with mcp_client(session) as client:
        await client.call_tool("medium_tool", {"n": 1})
        [pending] = (await pool.control("GET", "/control/approvals"))["approvals"]
        await pool.control("POST", f"/control/approvals/{pending['approval_id']}/allow", {})
        results = await asyncio.gather(*(client.call_tool("medium_tool", {"n": 1}) for _ in range(50)))
    assert sum(not r.is_error for r in results) == 1
    assert counter.runs == {"medium_tool": 1}


async def test_denied_approval_does_not_run_and_cannot_be_allowed_later(pool: Daemon, counter: Counter) -> None:
    session = await pool.new_session(mode="default")
    async with mcp_client(session) as client:
        await client.call_tool("medium_tool", {})
        [pending] = (await pool.control("GET", "/control/approvals"))["approvals"]
        await pool.control("POST", f"/control/approvals/{pending['approval_id']}/deny", {})
        await pool.control("POST", f"/control/approvals/{pending['approval_id']}/allow", {}, expect=409)
        again = await client.call_tool("medium_tool", {})
    assert _verdict_of_mcp(again) == "ask"
    assert counter.runs == {}


@pytest.mark.parametrize("action", ["accept", "decline", "cancel"])
async def test_elicitation_answers_the_question_when_the_client_supports_it(
    pool: Daemon, counter: Counter, action: str
) -> None:
    session = await pool.new_session(mode="default")
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=action, content={} if action == "accept" else None)

    async with mcp_client(session, mode="legacy", elicitation_callback=on_elicit) as client:
        result = await client.call_tool("medium_tool", {"n": 3})
    assert len(asked) == 1 and "medium_tool" in asked[0]
    if action == "accept":
        assert not result.is_error and counter.runs == {"medium_tool": 1}
    else:
        assert result.is_error and "declined" in tool_text(result) and counter.runs == {}
    assert (await pool.control("GET", "/control/approvals"))["approvals"] == []


async def test_billable_tools_ask_in_bypass_and_remember_per_group(pool: Daemon, counter: Counter) -> None:
    session = await pool.new_session(mode="bypass")

    async def remember(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert "remember" in params.requested_schema["properties"]
        return types.ElicitResult(action="accept", content={"remember": True})

    async with mcp_client(session, mode="legacy", elicitation_callback=remember) as client:
        first = await client.call_tool("tool_call", {"name": "paid_tool", "arguments": {}})
        assert not first.is_error
    async with mcp_client(session, mode="legacy") as client:  # no elicitation: only the memory can allow
        same_group = await client.call_tool("tool_call", {"name": "paid_images_b", "arguments": {}})
        other_group = await client.call_tool("tool_call", {"name": "paid_video", "arguments": {}})
        assert not same_group.is_error
        assert _verdict_of_mcp(other_group) == "ask"
    assert counter.runs == {"paid_tool": 1, "paid_images_b": 1}


async def test_modern_clients_get_a_pending_approval_instead_of_elicitation(pool: Daemon, counter: Counter) -> None:
    session = await pool.new_session(mode="default")
    async with mcp_client(session, mode="auto") as client:
        result = await client.call_tool("medium_tool", {})
    assert _verdict_of_mcp(result) == "ask" and counter.runs == {}


async def test_ending_a_session_drops_its_approvals(pool: Daemon) -> None:
    session = await pool.new_session(mode="default")
    async with mcp_client(session) as client:
        await client.call_tool("medium_tool", {})
    assert len((await pool.control("GET", "/control/approvals"))["approvals"]) == 1
    await pool.control("DELETE", f"/control/sessions/{session['session_id']}")
    assert (await pool.control("GET", "/control/approvals"))["approvals"] == []


def _break(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "empty":
        path.write_text("")
    elif how == "not-json":
        path.write_text("{'version': 1")
    elif how == "schema-invalid":
        path.write_text(json.dumps({"version": 1, "tools": {"paid_tool": {"approvalKind": "x"}}}))
    elif how == "wrong-version":
        path.write_text(json.dumps({"version": 2, "tools": {}}))
    elif how == "symlink":
        target = path.with_name("real.json")
        target.write_text(json.dumps(MANIFEST))
        target.chmod(0o600)
        path.unlink()
        path.symlink_to(target)
    elif how == "world-writable":
        path.chmod(0o666)


@pytest.mark.parametrize(
    "how", ["missing", "empty", "not-json", "schema-invalid", "wrong-version", "symlink", "world-writable"]
)
async def test_a_broken_billing_manifest_makes_every_call_ask_in_every_mode_on_both_paths(
    home: Path, workspace: Path, counter: Counter, manifest: Path, how: str
) -> None:
    _break(manifest, how)
    settings = Settings(tools=ToolSettings(defer=("low_tool",), billing_manifest=str(manifest)))
    async with running_daemon(Paths.resolve(), workspace, settings, registry=_registry(counter)) as daemon:
        for mode in ("read-only", "default", "bypass"):
            session = await daemon.new_session(mode=mode)
            async with mcp_client(session) as client:
                direct = await client.call_tool("low_tool", {})
                deferred = await client.call_tool("tool_call", {"name": "low_tool", "arguments": {}})
                calc = await client.call_tool("calculate", {"expression": "1+1"})
            for result in (direct, deferred, calc):
                assert _verdict_of_mcp(result) == "ask", (mode, tool_text(result))
            status, body = await rest(
                daemon, "POST", "/api/v1/mcp/tools/low_tool/invoke", session["headers"], {"arguments": {}}
            )
            assert (status, body["status"]) == (200, "approval_required")
        approvals = (await daemon.control("GET", "/control/approvals"))["approvals"]
        assert approvals and all(a["kind"] == "unverifiable" and a["group"] is None for a in approvals)
        # An unverifiable approval cannot be remembered for the session.
        await daemon.control(
            "POST", f"/control/approvals/{approvals[0]['approval_id']}/allow", {"remember": "session"}, expect=409
        )
    assert counter.runs == {}
