"""The raw lane: requests written as one stdin line each, responses picked off stdout by id."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR

from sidecar.connectors.lane import RawLane

WAIT = 5.0


@pytest.fixture
async def pipe() -> AsyncIterator[tuple[asyncio.StreamWriter, asyncio.StreamReader]]:
    """A connected pair standing in for the connector's stdin: what the lane writes, the test reads."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    reader, their_writer = await asyncio.open_connection(sock=theirs)
    yield writer, reader
    writer.close()
    their_writer.close()


async def _sent(reader: asyncio.StreamReader) -> dict[str, Any]:
    async with asyncio.timeout(WAIT):
        line = await reader.readline()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    message = json.loads(line)
    assert isinstance(message, dict)
    return message


def _answer(lane: RawLane, message: dict[str, Any]) -> bool:
    return lane.pick(json.dumps(message).encode() + b"\n")


async def test_a_request_is_one_line_and_its_response_is_its_result(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "echo", "arguments": {"text": "a\nb"}}))
    sent = await _sent(reader)
    assert sent["jsonrpc"] == "2.0" and sent["method"] == "tools/call"
    assert sent["params"] == {"name": "echo", "arguments": {"text": "a\nb"}}
    assert isinstance(sent["id"], str)
    assert lane.waiting == 1
    assert _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}})
    async with asyncio.timeout(WAIT):
        assert await call == {"content": []}
    assert lane.waiting == 0


async def test_an_error_response_raises_it_as_sent(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "nope"}, request_id="relay-7"))
    sent = await _sent(reader)
    assert sent["id"] == "relay-7"
    _answer(lane, {"jsonrpc": "2.0", "id": "relay-7", "error": {"code": -32602, "message": "no tool", "data": [1]}})
    with pytest.raises(MCPError) as raised:
        async with asyncio.timeout(WAIT):
            await call
    assert (raised.value.code, raised.value.message, raised.value.data) == (-32602, "no tool", [1])


async def test_a_response_without_a_result_object_is_an_error(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "echo"}))
    sent = await _sent(reader)
    assert _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": "text"})
    with pytest.raises(MCPError) as raised:
        async with asyncio.timeout(WAIT):
            await call
    assert raised.value.code == INTERNAL_ERROR


async def test_lines_that_are_not_its_responses_are_left_to_the_session(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "echo"}))
    sent = await _sent(reader)
    others = [
        {"jsonrpc": "2.0", "id": 3, "result": {}},  # the SDK session's integer ids
        {"jsonrpc": "2.0", "id": "someone-else", "result": {}},
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}},
        {"jsonrpc": "2.0", "id": sent["id"], "method": "sampling/createMessage", "params": {}},  # a request
    ]
    assert [_answer(lane, message) for message in others] == [False] * len(others)
    assert lane.pick(b"not json\n") is False
    assert not call.done()
    _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": {}})
    async with asyncio.timeout(WAIT):
        await call


async def test_a_cancelled_request_tells_the_connector_and_its_late_response_is_dropped(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "slow"}))
    sent = await _sent(reader)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(WAIT):
            await call
    cancelled = await _sent(reader)
    assert cancelled["method"] == "notifications/cancelled"
    assert cancelled["params"]["requestId"] == sent["id"]
    assert "id" not in cancelled
    # The late answer is the lane's own: taken (and dropped), never handed to the SDK session.
    assert _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": {}})
    assert lane.waiting == 0


async def test_closing_fails_waiting_and_later_requests_as_a_closed_connection(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    call = asyncio.create_task(lane.request("tools/call", {"name": "echo"}))
    await _sent(reader)
    lane.close()
    with pytest.raises(MCPError) as raised:
        async with asyncio.timeout(WAIT):
            await call
    assert raised.value.code == CONNECTION_CLOSED
    with pytest.raises(MCPError) as again:
        await lane.request("tools/call", {"name": "echo"})
    assert again.value.code == CONNECTION_CLOSED


async def test_arguments_that_are_not_json_are_refused_before_anything_is_written(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    with pytest.raises(MCPError) as raised:
        await lane.request("tools/call", {"name": "echo", "arguments": {"x": float("nan")}})
    assert raised.value.code == INTERNAL_ERROR
    assert lane.waiting == 0
    writer.write(b"marker\n")  # the next thing on the wire is this, so nothing came before it
    async with asyncio.timeout(WAIT):
        assert await reader.readline() == b"marker\n"
