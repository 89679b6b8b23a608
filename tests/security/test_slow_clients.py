"""No connection may hold the daemon open forever: the head of every request has a deadline.

The daemon runs in-process on ``127.0.0.1:0`` with a short head deadline; clients are raw sockets that
send nothing, or a request's head a byte at a time. Pacing the attacker's bytes needs sleeps; every wait
for the daemon's answer is bounded by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import aiohttp
import pytest

from sidecar.config import Limits, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, running_daemon

HEAD_TIMEOUT: Final = 1.0
"""The daemon's head deadline in these tests (seconds)."""
BOUND: Final = 10.0
"""Longest any wait for the daemon may take here."""
DRIP_PAUSE: Final = 0.1


@pytest.fixture
async def strict(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    root = tmp_path / "strict-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    settings = Settings(limits=Limits(head_read_timeout=HEAD_TIMEOUT))
    async with running_daemon(paths, workspace, settings) as daemon:
        yield daemon


def _head(daemon: Daemon, path: str = "/healthz") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n\r\n".encode()


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(BOUND):
        return await reader.read()


def _assert_408(reply: bytes) -> None:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), reply
    assert b"application/json" in head and b"X-Content-Type-Options: nosniff" in head, head
    assert json.loads(body)["error"]["code"] == "read_timeout"


async def _drip(writer: asyncio.StreamWriter, data: bytes) -> int:
    """Send ``data`` a byte at a time until the daemon hangs up; return how many bytes went out."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            await asyncio.sleep(DRIP_PAUSE)
    return sent


async def test_a_connection_that_sends_nothing_is_cut_off(strict: Daemon) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", strict.port)
    try:
        _assert_408(await _read_until_closed(reader))
    finally:
        writer.close()


async def test_a_head_sent_a_byte_at_a_time_is_cut_off(strict: Daemon) -> None:
    # Long enough that dripping it whole would take four times the deadline.
    head = _head(strict, "/healthz?" + "x" * int(4 * HEAD_TIMEOUT / DRIP_PAUSE))
    reader, writer = await asyncio.open_connection("127.0.0.1", strict.port)
    dripping = asyncio.create_task(_drip(writer, head))
    try:
        _assert_408(await _read_until_closed(reader))
        async with asyncio.timeout(BOUND):
            sent = await dripping
        assert sent < len(head), "the whole head went through: nothing was cut off"
    finally:
        dripping.cancel()
        writer.close()


async def test_a_later_head_on_a_kept_alive_connection_has_its_own_deadline(strict: Daemon) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", strict.port)
    try:
        writer.write(_head(strict))
        await writer.drain()
        async with asyncio.timeout(BOUND):
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            )
            await reader.readexactly(length)
        # The connection is kept alive; the next request's head now drips.
        dripping = asyncio.create_task(_drip(writer, _head(strict, "/healthz?" + "x" * 60)))
        try:
            _assert_408(await _read_until_closed(reader))
        finally:
            dripping.cancel()
    finally:
        writer.close()


async def test_a_slow_body_after_a_prompt_head_is_the_body_deadlines_business(strict: Daemon) -> None:
    """The head deadline stops at the end of the head: a body may take longer (its own limit applies)."""
    session = await strict.new_session()
    body = json.dumps({"arguments": {"expression": "6*7"}}).encode()
    head = (
        f"POST /api/v1/mcp/tools/calculate/invoke HTTP/1.1\r\nHost: 127.0.0.1:{strict.port}\r\n"
        f"Authorization: {session['headers']['Authorization']}\r\n"
        f"X-Sidecar-Context: {session['headers']['X-Sidecar-Context']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", strict.port)
    try:
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(HEAD_TIMEOUT * 1.5)  # pacing: past the head deadline, within the body's
        writer.write(body)
        await writer.drain()
        reply = await _read_until_closed(reader)
    finally:
        writer.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["result"] == "42"


async def test_hundreds_of_stalled_sockets_do_not_stop_healthz_or_a_tool_call(tmp_path: Path, workspace: Path) -> None:
    root = tmp_path / "crowded-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    # A deadline longer than the test, so every stalled socket is still open while real clients call.
    settings = Settings(limits=Limits(head_read_timeout=120.0))
    async with running_daemon(paths, workspace, settings) as daemon:
        stalled: list[asyncio.StreamWriter] = []
        dripping: list[asyncio.Task[int]] = []
        try:
            for index in range(300):
                _, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
                stalled.append(writer)
                if index % 3 == 0:  # a third send a head a byte at a time, the rest nothing at all
                    dripping.append(asyncio.create_task(_drip(writer, _head(daemon, "/" + "x" * 4000))))
            session = await daemon.new_session()
            async with asyncio.timeout(BOUND), aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{daemon.port}/healthz") as health:
                    assert health.status == 200
                    assert await health.json() == {"status": "ok"}
                async with http.post(
                    f"http://127.0.0.1:{daemon.port}/api/v1/mcp/tools/calculate/invoke",
                    json={"arguments": {"expression": "2**10"}},
                    headers=session["headers"],
                ) as call:
                    assert call.status == 200
                    assert (await call.json())["result"] == "1024"
            assert all(not task.done() for task in dripping), "a dripping socket ended early"
            assert all(not writer.is_closing() for writer in stalled)
        finally:
            for task in dripping:
                task.cancel()
            for writer in stalled:
                writer.close()
