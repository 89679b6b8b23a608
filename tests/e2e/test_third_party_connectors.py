"""Third-party MCP servers from the package registries, run as the user's own connectors.

``mcp-server-time`` comes from PyPI (a test extra) and ``@modelcontextprotocol/server-everything`` from
npm (``tests/third_party``, installed by ``scripts/test``). Both are configured in ``<config>/mcp.json``
exactly as a user would, trusted through the control API, and used through ``/mcp`` with the SDK client.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
from mcp import types

from sidecar.connectors.stdio.sandbox import detect
from tests.conftest import Daemon, mcp_client
from tests.helpers import tool_text, trust, write_user_servers

THIRD_PARTY = Path(__file__).resolve().parents[1] / "third_party"
EVERYTHING_BIN = THIRD_PARTY / "node_modules" / ".bin" / "mcp-server-everything"


def _servers() -> dict[str, dict[str, object]]:
    if shutil.which("npx") is None or not EVERYTHING_BIN.exists():
        pytest.fail("npx and tests/third_party/node_modules are required: run scripts/test, which installs them")
    return {
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
        # As a project that installed it runs it: npx from the project's directory (its own cwd, shown
        # read-only in its sandbox; npx's cache in its private home).
        "everything": {
            "command": "npx",
            "args": ["--no-install", "mcp-server-everything", "stdio"],
            "cwd": str(THIRD_PARTY),
        },
    }


async def _configure_and_trust(daemon: Daemon) -> None:
    write_user_servers(daemon, _servers())
    for connector in ("time", "everything"):
        shown = await trust(daemon, connector)
        assert shown["error"] is None, shown
        assert shown["sandbox"]["mode"] == ("on" if detect().available else "none"), shown


async def test_registry_servers_are_trusted_listed_and_called_through_mcp(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    # Only these connectors: no tool_search to find deferred tools with, so their tools are listed.
    session = await daemon.new_session(mode="bypass", allow=["mcp__time__*", "mcp__everything__*"])
    for era in ("legacy", "auto"):
        async with mcp_client(session, mode=era) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"mcp__time__get_current_time", "mcp__everything__echo", "mcp__everything__get-sum"} <= names

            now = await client.call_tool("mcp__time__get_current_time", {"timezone": "Asia/Tokyo"})
            assert not now.is_error
            assert "Asia/Tokyo" in tool_text(now)

            echo = await client.call_tool("mcp__everything__echo", {"message": "through sidecar"})
            assert tool_text(echo) == "Echo: through sidecar"

            image = await client.call_tool("mcp__everything__get-tiny-image", {})
            assert any(isinstance(block, types.ImageContent) for block in image.content)  # blocks pass through


async def test_unknown_third_party_tools_default_to_medium_and_ask(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    session = await daemon.new_session(mode="default", allow=["mcp__everything__*"])
    async with mcp_client(session) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["mcp__everything__echo"].meta["dev.sidecar/risk"] == "MEDIUM"  # type: ignore[index]
        asked = await client.call_tool("mcp__everything__echo", {"message": "x"})
    assert asked.is_error and "needs the user's approval" in tool_text(asked)


async def test_a_session_grant_can_name_a_whole_connector(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__time__*"])
    async with mcp_client(session) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        denied = await client.call_tool("mcp__everything__echo", {"message": "x"})
    assert names and all(n.startswith("mcp__time__") for n in names)
    assert tool_text(denied) == "tool not found or not available in this session"


async def test_resources_and_prompts_are_proxied_under_namespaced_names(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    session = await daemon.new_session(mode="read-only", allow=["mcp__everything__*"])
    async with mcp_client(session, mode="legacy") as client:
        resources = (await client.list_resources()).resources
        assert resources and all(str(r.uri).startswith("sidecar:everything/") for r in resources)
        first = resources[0]
        read = await client.read_resource(str(first.uri))
        assert read.contents and str(read.contents[0].uri) == str(first.uri)

        templates = (await client.list_resource_templates()).resource_templates
        assert all(t.uri_template.startswith("sidecar:everything/") for t in templates)

        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert "mcp__everything__simple-prompt" in prompts
        got = await client.get_prompt("mcp__everything__simple-prompt", {})
        assert got.messages

        with pytest.raises(Exception, match="not found"):
            await client.read_resource("sidecar:time/file:///etc/passwd")  # not offered, not visible


async def test_a_session_without_the_connector_in_its_grant_sees_no_resources(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    session = await daemon.new_session(allow=["calculate"])
    async with mcp_client(session, mode="legacy") as client:
        assert (await client.list_resources()).resources == []
        assert (await client.list_prompts()).prompts == []
        with pytest.raises(Exception, match="not found"):
            await client.read_resource("sidecar:everything/demo://resource/static/document/architecture.md")


async def test_progress_from_a_connector_reaches_the_client(daemon: Daemon) -> None:
    await _configure_and_trust(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__everything__*"])
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with mcp_client(session, mode="legacy") as client:
        result = await client.call_tool(
            "mcp__everything__trigger-long-running-operation",
            {"duration": 0.3, "steps": 3},
            progress_callback=on_progress,
        )
    assert not result.is_error
    assert [p for p, _ in seen] == [1, 2, 3] and all(t == 3 for _, t in seen)


UVX = Path(sys.executable).parent / "uvx"


async def test_a_uvx_started_server_runs_sandboxed_with_its_cache_in_its_own_home(daemon: Daemon) -> None:
    """As its README says to run it: ``uvx`` fetches it from PyPI into the connector's private home (the
    sandbox gives it the network it needs) and runs it; the cache stays for the next start."""
    assert UVX.exists(), "uv is a test extra: scripts/test installs it"
    # The system's certificates (a network that inspects TLS has its own CA there; uv's own list lacks it).
    entry = {"command": str(UVX), "args": ["mcp-server-time==2026.10.19"], "env": {"UV_NATIVE_TLS": "1"}}
    write_user_servers(daemon, {"clock": entry})
    async with asyncio.timeout(180):  # a first start downloads
        shown = await trust(daemon, "clock")
    assert shown["error"] is None and shown["sandbox"]["mode"] == "on", shown
    session = await daemon.new_session(mode="bypass", allow=["mcp__clock__*"])
    async with mcp_client(session) as client:
        now = await client.call_tool("mcp__clock__get_current_time", {"timezone": "Asia/Tokyo"})
    assert not now.is_error and "Asia/Tokyo" in tool_text(now)
    assert any((daemon.paths.data / "homes" / "clock").rglob("mcp_server_time*"))  # its cache, in its home


async def test_a_node_server_named_by_its_script_path_finds_its_dependencies_in_its_sandbox(daemon: Daemon) -> None:
    """As a desktop agent's config names a locally installed server: ``node <its dist/index.js>``, no cwd.
    Its dependencies are hoisted into the ``node_modules`` above its package, which its sandbox shows."""
    script = EVERYTHING_BIN.resolve()  # .../node_modules/@modelcontextprotocol/server-everything/dist/index.js
    node = shutil.which("node")
    if node is None or not script.exists():
        pytest.fail("node and tests/third_party/node_modules are required: run scripts/test, which installs them")
    write_user_servers(daemon, {"everything": {"command": node, "args": [str(script), "stdio"]}})
    shown = await trust(daemon, "everything")
    assert shown["error"] is None, shown
    session = await daemon.new_session(mode="bypass", allow=["mcp__everything__*"])
    async with mcp_client(session) as client:
        echo = await client.call_tool("mcp__everything__echo", {"message": "by its path"})
    assert tool_text(echo) == "Echo: by its path"
