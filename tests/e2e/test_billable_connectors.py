"""A connector's own ``high-credit-tools.json`` feeds the billable gate (issue 10, item 3), end to end.

A plugin's and a package's manifest name the connector's own tools and cover that connector alone. Their
tools ask in every mode, ``bypass`` included, on every path — ``tools/call`` and ``tool_call`` in both
protocol eras, REST, the connector's own route — whether deferred or listed; a manifest that is broken
makes every tool of its connector ask; ``connectors show`` says which tools cost money. A plugin's
``.mcp.json`` may say ``defer_loading``. Connectors are the echo fixture in real subprocesses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import pytest
from mcp import types

from tests.conftest import Daemon, cli_output, mcp_client
from tests.helpers import ECHO_SERVER, copy_echo_server, python_server, rest, tool_text, trust, write_user_servers

pytestmark = pytest.mark.slow  # the connectors run as processes

ERAS: Final = ("legacy", "2026-07-28")
BOUND: Final = 30.0
MANIFEST: Final = {
    "version": 1,
    "tools": {
        "echo": {"approvalKind": "image-generation", "group": "images"},
        "argv": {"approvalKind": "image-generation", "group": "images"},
        "env_keys": {"approvalKind": "video-generation", "group": "video"},
    },
}


def _write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    path.chmod(0o600)
    return path


def _plugin(daemon: Daemon, manifest: Any = MANIFEST, **entry: Any) -> Path:
    """Plugin ``studio`` with one server, ``echo`` (connector ``studio-echo``), and its billing manifest."""
    root = daemon.paths.data / "plugins" / "studio"
    _write(root / ".mcp.json", {"mcpServers": {"echo": {**python_server(ECHO_SERVER), **entry}}})
    _write(root / "high-credit-tools.json", manifest)
    return root


def _package(daemon: Daemon) -> Path:
    """Package ``meter``: the echo fixture with LOW tools (so read-only sessions see them) and a manifest."""
    root = daemon.paths.data / "connectors" / "meter"
    root.mkdir(parents=True)
    copy_echo_server(root)
    tools = {name: {"risk": "LOW"} for name in ("echo", "argv", "env_keys")}
    _write(root / "connector.json", {"id": "meter", "name": "Meter", "type": "mcp", "tools": tools})
    server = {"command": sys.executable, "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py"]}
    _write(root / "mcp.json", {"mcpServers": {"meter": server}})
    _write(root / "high-credit-tools.json", {"version": 1, "tools": {"echo": MANIFEST["tools"]["echo"]}})
    return root


def _verdict(text: str, is_error: bool) -> str:
    if not is_error:
        return "ran"
    if "needs the user's approval" in text:
        return "asked"
    return f"other: {text}"


async def _verdicts(daemon: Daemon, session: dict[str, Any], tool: str, arguments: dict[str, Any]) -> list[str]:
    """What one call of ``tool`` gets on /mcp directly and through ``tool_call`` in each era, and on REST."""
    found = []
    for era in ERAS:
        async with mcp_client(session, mode=era) as client:
            direct = await client.call_tool(tool, arguments)
            deferred = await client.call_tool("tool_call", {"name": tool, "arguments": arguments})
        found += [_verdict(tool_text(direct), direct.is_error), _verdict(tool_text(deferred), deferred.is_error)]
    status, body = await rest(
        daemon, "POST", f"/api/v1/mcp/tools/{tool}/invoke", session["headers"], {"arguments": arguments}
    )
    assert status == 200, body
    found.append({"ok": "ran", "approval_required": "asked"}.get(body["status"], f"other: {body}"))
    return found


async def _relayed(session: dict[str, Any], tool: str, arguments: dict[str, Any]) -> list[str]:
    found = []
    for era in ERAS:
        async with mcp_client(session, mode=era) as client:
            result = await client.call_tool(tool, arguments)
        found.append(_verdict(tool_text(result), result.is_error))
    return found


async def test_a_remembered_group_covers_its_own_connector_not_another_of_the_same_name(daemon: Daemon) -> None:
    _plugin(daemon)
    _package(daemon)
    await trust(daemon, "studio-echo")
    await trust(daemon, "meter")
    session = await daemon.new_session(mode="bypass", allow=["mcp__studio-echo__*", "mcp__meter__*"])
    async with mcp_client(session, mode="legacy") as client:
        asked = await client.call_tool("mcp__studio-echo__echo", {"text": "x"})
        assert _verdict(tool_text(asked), asked.is_error) == "asked"
        [pending] = (await daemon.control("GET", "/control/approvals"))["approvals"]
        await daemon.control("POST", f"/control/approvals/{pending['approval_id']}/allow", {"remember": "session"})
        own = await client.call_tool("mcp__studio-echo__echo", {"text": "again"})
        other = await client.call_tool("mcp__meter__echo", {"text": "x"})
    assert (tool_text(own), own.is_error) == ("again", False)
    assert _verdict(tool_text(other), other.is_error) == "asked"  # meter's "images" was never approved
    [still] = (await daemon.control("GET", "/control/approvals"))["approvals"]
    assert (still["tool"], still["group"]) == ("mcp__meter__echo", "meter/images")


async def test_a_plugins_billable_tools_ask_in_every_mode_on_every_path(daemon: Daemon, home: Path) -> None:
    _plugin(daemon, defer_loading=["env_keys"])  # a plugin's .mcp.json may say defer_loading: honoured
    listing = await daemon.control("GET", "/control/connectors")
    assert listing["problems"] == [] and {c["id"] for c in listing["connectors"]} >= {"studio-echo"}
    await trust(daemon, "studio-echo")

    for mode in ("default", "bypass"):  # its tools are MEDIUM (unclassified): read-only sees none of them
        session = await daemon.new_session(mode=mode, allow=["mcp__studio-echo__*", "tool_search", "tool_call"])
        assert await _verdicts(daemon, session, "mcp__studio-echo__echo", {"text": "x"}) == ["asked"] * 5, mode
        routed = await daemon.new_session(mode=mode, connector="studio-echo")
        assert await _relayed(routed, "echo", {"text": "x"}) == ["asked", "asked"], mode
    # A tool the manifest does not list is free: bypass runs it.
    free = await _verdicts(daemon, session, "mcp__studio-echo__sleep", {"seconds": 0})
    assert free == ["ran"] * 5
    async with mcp_client(session, mode="legacy") as client:
        listed = {t.name for t in (await client.list_tools()).tools}
    assert "mcp__studio-echo__echo" in listed and "mcp__studio-echo__env_keys" not in listed  # its defer_loading

    # Allowing one call, remembered for the session, covers its group (images), not another (video).
    [pending, *_] = (await daemon.control("GET", f"/control/approvals?session={session['session_id']}"))["approvals"]
    assert (pending["tool"], pending["kind"], pending["group"]) == (
        "mcp__studio-echo__echo",
        "image-generation",
        "studio-echo/images",  # a connector's group is its own: another connector's "images" is another
    )
    await daemon.control("POST", f"/control/approvals/{pending['approval_id']}/allow", {"remember": "session"})
    async with mcp_client(session, mode="legacy") as client:
        again = await client.call_tool("mcp__studio-echo__echo", {"text": "x"})
        same_group = await client.call_tool("mcp__studio-echo__argv", {})
        other_group = await client.call_tool("tool_call", {"name": "mcp__studio-echo__env_keys", "arguments": {}})
    assert (tool_text(again), same_group.is_error) == ("x", False)
    assert _verdict(tool_text(other_group), other_group.is_error) == "asked"

    shown = await daemon.control("GET", "/control/connectors/studio-echo")
    assert shown["billable"] == MANIFEST["tools"] and shown["billing_problem"] is None
    text = await cli_output(home, "connectors", "show", "studio-echo")
    assert "echo (image-generation, group images)" in text and "env_keys (video-generation, group video)" in text


async def test_a_packages_billable_tools_ask_even_in_read_only_and_bypass(daemon: Daemon) -> None:
    _package(daemon)
    await trust(daemon, "meter")
    for mode in ("read-only", "default", "bypass"):
        session = await daemon.new_session(mode=mode, allow=["*"])
        assert await _verdicts(daemon, session, "mcp__meter__echo", {"text": "x"}) == ["asked"] * 5, mode
        assert await _verdicts(daemon, session, "mcp__meter__argv", {}) == ["ran"] * 5, mode
    routed = await daemon.new_session(mode="bypass", connector="meter")
    assert await _relayed(routed, "echo", {"text": "x"}) == ["asked", "asked"]
    assert await _relayed(routed, "argv", {}) == ["ran", "ran"]
    shown = await daemon.control("GET", "/control/connectors/meter")
    assert list(shown["billable"]) == ["echo"]
    # The built-ins' manifest is another scope: a built-in named like a connector's billable tool is free.
    async with mcp_client(session) as client:
        assert not (await client.call_tool("calculate", {"expression": "1"})).is_error


async def test_a_user_entrys_declared_billable_tools_ask_in_bypass_and_show(daemon: Daemon) -> None:
    billable = {"approvalKind": "image-generation", "group": "images"}
    tools = {"echo": {"risk": "LOW", "billable": billable}, "argv": {"risk": "LOW"}}
    write_user_servers(daemon, {"mine": {**python_server(ECHO_SERVER), "tools": tools}})
    await trust(daemon, "mine")
    session = await daemon.new_session(mode="bypass", allow=["*"])
    assert await _verdicts(daemon, session, "mcp__mine__echo", {"text": "x"}) == ["asked"] * 5
    assert await _verdicts(daemon, session, "mcp__mine__argv", {}) == ["ran"] * 5
    shown = await daemon.control("GET", "/control/connectors/mine")
    assert shown["billable"] == {"echo": billable} and shown["billing_problem"] is None


@pytest.mark.parametrize("how", ["schema-invalid", "not-json", "world-writable"])
async def test_a_broken_manifest_makes_every_tool_of_its_connector_ask(daemon: Daemon, home: Path, how: str) -> None:
    bad = {"version": 1, "tools": {"echo": {"approvalKind": "x"}}} if how == "schema-invalid" else MANIFEST
    root = _plugin(daemon, manifest="{'version': 1" if how == "not-json" else bad)
    await trust(daemon, "studio-echo")
    if how == "world-writable":
        (root / "high-credit-tools.json").chmod(0o666)  # after trust: the mode is not in the trust key
    session = await daemon.new_session(mode="bypass", allow=["*"])
    for tool, arguments in (("mcp__studio-echo__echo", {"text": "x"}), ("mcp__studio-echo__sleep", {"seconds": 0})):
        assert await _verdicts(daemon, session, tool, arguments) == ["asked"] * 5, tool
    routed = await daemon.new_session(mode="bypass", connector="studio-echo")
    assert await _relayed(routed, "sleep", {"seconds": 0}) == ["asked", "asked"]
    approvals = (await daemon.control("GET", "/control/approvals"))["approvals"]
    assert approvals and all((a["kind"], a["group"]) == ("unverifiable", None) for a in approvals)
    # Everything else is unaffected: the built-ins and another connector's tools.
    async with mcp_client(session) as client:
        result = await client.call_tool("calculate", {"expression": "2"})
    assert not result.is_error and isinstance(result.content[0], types.TextContent)

    shown = await daemon.control("GET", "/control/connectors/studio-echo")
    assert shown["billable"] == {} and shown["billing_problem"].startswith("every tool asks: ")
    assert "high-credit-tools.json" in shown["billing_problem"]
    assert "billing_problem every tool asks" in await cli_output(home, "connectors", "show", "studio-echo")
