"""Built-in tools through the real daemon: notes across sessions, the HIGH example, meta-tools, auto-defer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.config import Settings, ToolSettings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import tool_text


async def test_notes_persist_across_sessions_of_a_project_and_stay_per_project(daemon: Daemon) -> None:
    writer = await daemon.new_session(project="alpha", mode="bypass")
    reader = await daemon.new_session(project="alpha", mode="read-only")
    stranger = await daemon.new_session(project="beta", mode="read-only")
    async with mcp_client(writer) as client:
        saved = await client.call_tool("note_save", {"text": "The build needs `make gen` first."})
        assert not saved.is_error
    async with mcp_client(reader) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "notes_read" in names and "note_save" not in names  # read-only sees LOW only
        assert "make gen" in tool_text(await client.call_tool("notes_read", {}))
    async with mcp_client(stranger) as client:
        assert tool_text(await client.call_tool("notes_read", {})) == "no notes yet for this project"
    notebooks = list((daemon.paths.data / "notes").iterdir())
    assert len(notebooks) == 1 and oct(notebooks[0].stat().st_mode & 0o777) == "0o600"


async def test_note_save_asks_in_default_mode(daemon: Daemon) -> None:
    session = await daemon.new_session(project="alpha")
    async with mcp_client(session) as client:
        result = await client.call_tool("note_save", {"text": "x"})
    assert result.is_error and "needs the user's approval" in tool_text(result)
    assert not (daemon.paths.data / "notes").exists()


@pytest.mark.parametrize("mode", ["read-only", "default", "bypass"])
async def test_the_high_example_is_never_listed_searchable_or_callable(daemon: Daemon, mode: str) -> None:
    session = await daemon.new_session(project="alpha", mode=mode, allow=["*", "notes_clear"])
    async with mcp_client(session) as client:
        assert "notes_clear" not in {t.name for t in (await client.list_tools()).tools}
        found = await client.call_tool("tool_search", {"query": "erase notes clear notebook"})
        assert "notes_clear" not in str(found.structured_content)
        direct = await client.call_tool("notes_clear", {})
        via_tool_call = await client.call_tool("tool_call", {"name": "notes_clear"})
    for result in (direct, via_tool_call):
        assert tool_text(result) == "tool not found or not available in this session"


async def test_list_connectors_is_empty_until_connectors_exist(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session) as client:
        result = await client.call_tool("list_connectors", {})
    assert result.structured_content == {"connectors": []}


async def test_tool_call_refuses_to_call_itself(daemon: Daemon) -> None:
    session = await daemon.new_session()
    async with mcp_client(session) as client:
        result = await client.call_tool("tool_call", {"name": "tool_call", "arguments": {"name": "calculate"}})
    assert result.is_error


async def _noop(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
    return ToolOutput(text="ok")


@pytest.fixture
async def crowded(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    registry = ToolRegistry()
    for i in range(30):
        registry.add(name=f"extra_{i:02d}", description=f"Extra tool number {i}.", risk=Risk.LOW, handler=_noop)
    settings = Settings(tools=ToolSettings(auto_defer_above=20))
    async with running_daemon(Paths.resolve(), workspace, settings, registry=registry) as d:
        yield d


async def test_a_pool_over_the_threshold_is_deferred_except_the_meta_tools(crowded: Daemon) -> None:
    big = await crowded.new_session()
    small = await crowded.new_session(allow=["extra_01", "calculate", "tool_search", "tool_call"])
    async with mcp_client(big) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"tool_search", "tool_call", "list_connectors"}
        found = await client.call_tool("tool_search", {"query": "extra 07"})
        assert (found.structured_content or {})["tools"][0]["name"] == "extra_07"
        assert not (await client.call_tool("tool_call", {"name": "extra_07"})).is_error
    async with mcp_client(small) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {
            "extra_01",
            "calculate",
            "tool_search",
            "tool_call",
        }
