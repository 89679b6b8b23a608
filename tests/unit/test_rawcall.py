"""A proxied tools/call as raw JSON-RPC: the SDK seam it reaches into, and the one shape check of its result."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
from mcp import ClientSession

from sidecar.connectors.rawcall import NOT_A_RESULT, call_tool_raw, send_to_connector, tool_result
from sidecar.errors import ToolError


class _Dispatcher:
    """Records what the session sends; answers with a canned raw result."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.sent: list[tuple[str, Any, Any]] = []

    async def send_raw_request(self, method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        self.sent.append((method, params, opts))
        return self.answer

    async def notify(self, method: str, params: Any, opts: Any = None) -> None:
        return None


async def test_the_call_goes_out_raw_through_the_sessions_own_dispatcher() -> None:
    # Pins the SDK seam (mcp 2.3): ClientSession._stamp and ._dispatcher. If the SDK moves them, this fails first.
    answer = {"content": [{"type": "text", "text": "hi", "extra": 1}], "isError": False}
    dispatcher = _Dispatcher(answer)
    client = ClientSession(dispatcher=dispatcher)  # type: ignore[arg-type]
    stamped: list[dict[str, Any]] = []
    original = client._stamp

    def stamp(data: dict[str, Any], opts: Any) -> None:
        stamped.append(data)
        original(data, opts)
        opts.setdefault("headers", {})["X-Era"] = "stamped"

    client._stamp = stamp

    reported: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, total, message))

    got = await call_tool_raw(client, "echo", {"text": "hi"}, within=10, on_progress=progress)
    assert got is answer  # not re-typed: the connector's own dict, unknown fields and all
    [(method, params, opts)] = dispatcher.sent
    assert method == "tools/call"
    assert params == {"name": "echo", "arguments": {"text": "hi"}}
    await opts["on_progress"](1, 2, "half")  # the dispatcher's callback reaches the caller's (in order)
    assert reported == [(1, 2, "half")]
    assert opts["headers"] == {"X-Era": "stamped"}
    assert stamped and stamped[0]["method"] == "tools/call"


def test_a_result_keeps_its_blocks_and_joins_their_text() -> None:
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    raw = {
        "content": [{"type": "text", "text": "a"}, image, {"type": "text", "text": "b"}],
        "structuredContent": {"n": 1},
        "isError": True,
    }
    output = tool_result(raw)
    assert output.text == "a\nb"
    assert output.content == ({"type": "text", "text": "a"}, image, {"type": "text", "text": "b"})
    assert output.structured == {"n": 1}
    assert output.is_error is True
    assert tool_result({"content": [image]}).text == "[1 blocks]"
    assert tool_result({"content": []}).is_error is False


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"resultType": "input_required", "inputRequests": {}},
        {"content": "text"},
        {"content": ["text"]},
        {"content": [{"text": "no type"}]},
        {"content": [{"type": 3}]},
        {"content": [], "structuredContent": [1, 2]},
    ],
)
def test_anything_but_a_tool_result_is_a_tool_error(raw: dict[str, Any]) -> None:
    with pytest.raises(ToolError, match=NOT_A_RESULT):
        tool_result(raw)


class _Lane:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    async def request(self, method: str, params: Any, *, request_id: Any = None, on_progress: Any = None) -> Any:
        self.sent.append((method, params, request_id))
        return {"via": "lane"}


async def test_one_function_sends_every_request_a_tools_call_on_the_lane_the_rest_through_the_dispatcher() -> None:
    lane, dispatcher = _Lane(), _Dispatcher({"via": "dispatcher"})
    send = partial(send_to_connector, dispatcher=dispatcher, lane=lane, within=10)
    assert await send("tools/call", {"name": "x"}, options={"request_id": "sidecar-1"}) == {"via": "lane"}
    assert await send("tools/list", None, options={}) == {"via": "dispatcher"}
    assert lane.sent == [("tools/call", {"name": "x"}, "sidecar-1")]
    assert [(method, params) for method, params, _ in dispatcher.sent] == [("tools/list", None)]
    # Without a lane (an HTTP connector), a tools/call goes through the dispatcher too.
    assert await send_to_connector(
        "tools/call", {"name": "x"}, dispatcher=dispatcher, lane=None, options={}, within=10
    ) == {"via": "dispatcher"}


async def test_a_request_past_its_bound_is_a_timeout_on_either_path() -> None:
    class Stuck:
        async def request(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.Event().wait()

        async def send_raw_request(self, *args: Any) -> Any:
            await asyncio.Event().wait()

    stuck = Stuck()
    for method, lane in (("tools/call", stuck), ("tools/list", None)):
        with pytest.raises(TimeoutError):
            await send_to_connector(method, {}, dispatcher=stuck, lane=lane, options={}, within=0.01)  # type: ignore[arg-type]
