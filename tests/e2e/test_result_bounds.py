"""Tool results are bounded for the agent's context window (``[tools] max_result_chars``, default 8 000).

Through the real daemon: a tool registered at the registry seam on ``/mcp`` (both eras) and REST, and a
real connector process on ``/mcp`` and on its own relayed route (both eras, the SDK's client).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest
from mcp import types

from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.config import Settings, ToolSettings
from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import ECHO_SERVER, rest, tool_text, trust_user_server, unfenced

ERAS: Final = [pytest.param("legacy", id="2025-11-25"), pytest.param("2026-07-28", id="2026-07-28")]
DEFAULT_BOUND: Final = 8000
BIG: Final = 20_000
TEXT_MARKER: Final = re.compile(r"\[truncated: (\d+) of (\d+) characters left out; results are cut at (\d+) ")
STRUCTURED_MARKER: Final = re.compile(r"\[truncated: structured content of (\d+) characters left out")


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    async def big(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        return ToolOutput(text="t" * BIG, structured={"data": "s" * BIG})

    async def small(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        return ToolOutput(text="fits", structured={"data": "fits"})

    registry.add(name="big_result", description="Returns a long result.", risk=Risk.LOW, handler=big)
    registry.add(name="small_result", description="Returns a short result.", risk=Risk.LOW, handler=small)
    return registry


@pytest.fixture
async def bounded(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(Paths.resolve(), workspace, registry=_registry()) as d:
        yield d


def _left_out(text: str) -> tuple[int, int, int]:
    match = TEXT_MARKER.search(text)
    assert match is not None, text[-300:]
    left, total, bound = (int(g) for g in match.groups())
    return left, total, bound


@pytest.mark.parametrize("era", ERAS)
async def test_a_long_result_is_cut_at_the_bound_and_says_how_much_was_left_out(bounded: Daemon, era: str) -> None:
    session = await bounded.new_session(allow=["big_result", "small_result"])
    async with mcp_client(session, mode=era) as client:
        result = await client.call_tool("big_result", {})
        small = await client.call_tool("small_result", {})
    text = tool_text(result)
    assert not result.is_error
    assert text.startswith("t" * DEFAULT_BOUND) and "t" * (DEFAULT_BOUND + 1) not in text
    assert _left_out(text) == (BIG - DEFAULT_BOUND, BIG, DEFAULT_BOUND)
    # The structured content is longer than the bound too: left out whole, with the same marker.
    assert result.structured_content is None
    match = STRUCTURED_MARKER.search(text)
    assert match is not None and int(match.group(1)) > BIG
    # A result within the bound is untouched.
    assert tool_text(small) == "fits" and small.structured_content == {"data": "fits"}


async def test_rest_results_are_bounded_the_same_way(bounded: Daemon) -> None:
    session = await bounded.new_session(allow=["big_result"])
    status, body = await rest(bounded, "POST", "/api/v1/mcp/tools/big_result/invoke", session["headers"], {})
    assert status == 200 and body["status"] == "ok"
    assert _left_out(body["result"]) == (BIG - DEFAULT_BOUND, BIG, DEFAULT_BOUND)
    assert STRUCTURED_MARKER.search(body["result"]) is not None
    assert body["structured"] is None


async def test_the_bound_is_a_setting(home: Path, workspace: Path) -> None:
    settings = Settings(tools=ToolSettings(max_result_chars=1000))
    async with running_daemon(Paths.resolve(), workspace, settings, registry=_registry()) as d:
        session = await d.new_session(allow=["big_result"])
        async with mcp_client(session) as client:
            text = tool_text(await client.call_tool("big_result", {}))
    assert text.startswith("t" * 1000) and "t" * 1001 not in text
    assert _left_out(text) == (BIG - 1000, BIG, 1000)


# -- a real connector process ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("era", ERAS)
async def test_a_connectors_long_result_is_bounded_on_mcp_and_on_its_own_route(daemon: Daemon, era: str) -> None:
    await trust_user_server(daemon, "echo", ECHO_SERVER)
    long_text = "e" * BIG
    pooled = await daemon.new_session(mode="bypass", allow=["mcp__echo__*"])
    async with mcp_client(pooled, mode=era) as client:
        result = await client.call_tool("mcp__echo__echo", {"text": long_text})
    _assert_cut(result, is_error=False)

    own = await daemon.new_session(mode="bypass", connector="echo")
    async with mcp_client(own, mode=era) as client:
        relayed = await client.call_tool("echo", {"text": long_text})
        fits = await client.call_tool("echo", {"text": "short"})
    _assert_cut(relayed, is_error=True)
    assert not fits.is_error and tool_text(fits) == "short"


def _assert_cut(result: types.CallToolResult, *, is_error: bool) -> None:
    blocks = [unfenced(b.text) for b in result.content if isinstance(b, types.TextContent)]
    assert blocks[0] == "e" * DEFAULT_BOUND, blocks[0][:40]
    assert _left_out(blocks[-1]) == (BIG - DEFAULT_BOUND, BIG, DEFAULT_BOUND)
    # The echo tool declares an output schema and answers structured content as long as its text:
    # left out, with the marker; on the relay that makes it an error result, which a client does not
    # check against the output schema (a success without structured content would be rejected).
    assert result.structured_content is None and result.is_error is is_error
    assert STRUCTURED_MARKER.search(blocks[-1]) is not None
