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

from sidecar.connectors.stdio.framing import StdioFraming
from sidecar.connectors.stdio.lane import RawLane

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


def _offer(lane: RawLane, line: bytes) -> bool:
    """What the stdout reader does with a line: the lane takes it (True) or leaves it to the session."""
    taken = lane.claim(line)
    if taken is None:
        return False
    lane.take(taken)
    return True


def _answer(lane: RawLane, message: dict[str, Any]) -> bool:
    return _offer(lane, json.dumps(message).encode() + b"\n")


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
    assert _offer(lane, b"not json\n") is False
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


async def test_a_requests_progress_reaches_its_callback_in_order_and_others_pass(pipe: Any) -> None:
    writer, reader = pipe
    lane = RawLane("echo", writer)
    seen: list[tuple[float, float | None, str | None]] = []
    all_seen = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))
        if len(seen) == 3:
            all_seen.set()

    params = {"name": "tick", "arguments": {}, "_meta": {"progressToken": "the client's", "other": 1}}
    call = asyncio.create_task(lane.request("tools/call", params, on_progress=progress))
    sent = await _sent(reader)
    assert sent["params"]["_meta"] == {"progressToken": sent["id"], "other": 1}  # its id is its token
    for step in (1, 2, 3):
        note = {"progressToken": sent["id"], "progress": step, "total": 3, "message": f"step {step}"}
        assert _answer(lane, {"jsonrpc": "2.0", "method": "notifications/progress", "params": note})
    foreign = {"progressToken": 7, "progress": 1}  # the SDK session's own
    assert not _answer(lane, {"jsonrpc": "2.0", "method": "notifications/progress", "params": foreign})
    _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}})
    async with asyncio.timeout(WAIT):
        assert await call == {"content": []}
        await all_seen.wait()
    assert seen == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]


@pytest.mark.parametrize("answer", ["result", "error"])
async def test_a_request_ends_only_after_its_slow_progress_callbacks_have_finished_in_order(
    pipe: Any, answer: str
) -> None:
    # A relay's callback sends on the client's stream and may take several loop turns; the response
    # closes that stream, so the caller must not have it before every progress it read first was sent.
    writer, reader = pipe
    lane = RawLane("echo", writer)
    order: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        for _ in range(int(10 - 3 * value)):  # the earlier, the slower: started first is not done first
            await asyncio.sleep(0)
        order.append(f"progress {value:g}")

    async def caller() -> None:
        try:
            await lane.request("tools/call", {"name": "tick"}, on_progress=progress)
            order.append("result")
        except MCPError as exc:
            order.append(f"error {exc.error.code}")

    call = asyncio.create_task(caller())
    sent = await _sent(reader)
    for step in (1, 2, 3):
        note = {"progressToken": sent["id"], "progress": step}
        assert _answer(lane, {"jsonrpc": "2.0", "method": "notifications/progress", "params": note})
    if answer == "result":
        _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}})
    else:
        _answer(lane, {"jsonrpc": "2.0", "id": sent["id"], "error": {"code": -32000, "message": "no"}})
    async with asyncio.timeout(WAIT):
        await call
    last = "result" if answer == "result" else "error -32000"
    assert order == ["progress 1", "progress 2", "progress 3", last]
    assert lane.waiting == 0


async def test_what_the_connector_wrote_before_a_lane_response_reaches_the_session_first(pipe: Any) -> None:
    # The session's dispatcher spawns a task per notification it reads, as the SDK's does; the lane must
    # not wake its caller ahead of them, or a log line written before the result would follow it.
    writer, reader = pipe
    framing = StdioFraming("echo", max_line_bytes=1 << 20)
    framing.lane = lane = RawLane("echo", writer)
    order: list[str] = []

    async def dispatcher() -> None:
        spawned: set[asyncio.Task[None]] = set()

        async def notify(message: Any) -> None:
            order.append(f"notify {message.message.method}")

        with framing.inbound:
            async for message in framing.inbound:
                task = asyncio.create_task(notify(message))
                spawned.add(task)
                task.add_done_callback(spawned.discard)

    async def caller() -> None:
        await lane.request("tools/call", {"name": "echo"})
        order.append("response")

    session = asyncio.create_task(dispatcher())
    call = asyncio.create_task(caller())
    sent = await _sent(reader)
    stdout = asyncio.StreamReader()
    log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    answer = {"jsonrpc": "2.0", "id": sent["id"], "result": {"content": []}}
    stdout.feed_data(json.dumps(log).encode() + b"\n" + json.dumps(answer).encode() + b"\n")  # one read
    stdout.feed_eof()
    async with asyncio.timeout(WAIT):
        await framing.read_stdout(stdout, on_overflow=lambda reason: None)
        await call
        await session
    assert order == ["notify notifications/message", "response"]
