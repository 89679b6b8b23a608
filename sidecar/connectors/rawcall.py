"""A proxied ``tools/call`` as raw JSON-RPC through a connector's ``ClientSession``.

The SDK's typed ``ClientSession.call_tool`` builds pydantic models of the request and of the result,
validates the result against the per-era result schema, and checks structured content against the
tool's output schema (listing the tools first if it has not). A proxied call only forwards the
result, so none of that pays: the request goes out as a dict through the session's own dispatcher
(ids, progress tokens, cancellation and the era's stamp as ``call_tool`` does), and the result is
checked once, cheaply, for the shape the bus relies on (``tool_result``). Its blocks reach the client
as the connector sent them; the edge's own serialization still checks them against the era's schema.

The session's stamp and dispatcher have no public accessor in the SDK (``mcp`` 2.3): they are reached
through ``sidecar.seams.sdk_client``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from mcp import ClientSession
from mcp.shared.dispatcher import CallOptions, Dispatcher, ProgressFnT

from sidecar.bus.registry import Progress, ToolOutput
from sidecar.connectors.progress import in_order
from sidecar.connectors.stdio.lane import RawLane
from sidecar.errors import ToolError
from sidecar.seams.sdk_client import client_dispatcher, stamp_request

__all__ = ["call_tool_raw", "send_to_connector", "tool_result"]

NOT_A_RESULT = "the connector answered with something other than a tool result"


async def send_to_connector(
    method: str,
    params: Mapping[str, Any] | None,
    *,
    dispatcher: Dispatcher[Any],
    lane: RawLane | None,
    options: CallOptions,
    within: float,
) -> dict[str, Any]:
    """The one way a request of ours reaches a connector: the bus's calls, the relay's, an HTTP connector's.

    A stdio connector's ``tools/call`` (``lane`` given) goes straight onto its stdin (``lane.RawLane``),
    whose cancel is written without awaiting, so it needs no task of its own; anything else goes through
    the session's dispatcher in a task of its own (``wait_for``): the SDK server cancels a handler again at
    every checkpoint (anyio scopes), and only a separate task lets the dispatcher's
    ``notifications/cancelled`` reach the connector when the caller gives up. Either way the answer waits
    for the request's progress to be relayed first (``progress.in_order``). ``TimeoutError`` after
    ``within`` seconds (the connector is told); ``MCPError`` for the connector's error or a lost connection.
    """
    on_progress = options.get("on_progress")
    if lane is not None and method == "tools/call":
        async with asyncio.timeout(within):
            return await lane.request(
                method,
                params or {},
                request_id=cast(str | None, options.get("request_id")),
                on_progress=cast(Progress | None, on_progress),
            )
    return await in_order(
        lambda opts: asyncio.wait_for(dispatcher.send_raw_request(method, params, opts), within), options
    )


async def call_tool_raw(
    client: ClientSession,
    name: str,
    arguments: Mapping[str, Any],
    *,
    within: float,
    on_progress: Progress | None = None,
    lane: RawLane | None = None,
) -> dict[str, Any]:
    """Send ``tools/call`` on a client session and return the connector's result as it came (a dict).

    Stamped with the era's headers and ``_meta`` exactly as ``call_tool`` stamps them (the headers have
    no wire on a stdio lane), then sent by ``send_to_connector``.
    """
    data: dict[str, Any] = {"method": "tools/call", "params": {"name": name, "arguments": dict(arguments)}}
    opts: CallOptions = {}
    stamp_request(client, data, opts)
    if on_progress is not None:
        opts["on_progress"] = cast(ProgressFnT, on_progress)  # the SDK calls it positionally
    return await send_to_connector(
        "tools/call", data["params"], dispatcher=client_dispatcher(client), lane=lane, options=opts, within=within
    )


def tool_result(raw: Mapping[str, Any]) -> ToolOutput:
    """The bus's view of a connector's raw result: its blocks as they came, their text, its structured content.

    Checked for what the bus relies on only: ``content`` a list of objects with a string ``type``,
    ``structuredContent`` an object or absent; anything else is a ``ToolError`` (an ``input_required``
    answer included: the bus asks through its own approvals, never through a connector's rounds).
    """
    content = raw.get("content")
    if not isinstance(content, list):
        raise ToolError(NOT_A_RESULT)
    texts: list[str] = []
    for block in content:
        if not isinstance(block, dict) or not isinstance(kind := block.get("type"), str):
            raise ToolError(NOT_A_RESULT)
        if kind == "text":
            texts.append(str(block.get("text", "")))
    structured = raw.get("structuredContent")
    if structured is not None and not isinstance(structured, dict):
        raise ToolError(NOT_A_RESULT)
    return ToolOutput(
        text="\n".join(texts) or f"[{len(content)} blocks]",
        structured=structured,
        content=tuple(content),
        is_error=bool(raw.get("isError")),
    )
