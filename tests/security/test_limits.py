"""Request bounds (contract §3): a slow body, an oversized header, too many headers — each a JSON 4xx."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.config import Limits, Settings
from sidecar.paths import Paths
from tests.conftest import Daemon, raw_request, running_daemon
from tests.helpers import response_head

READ_TIMEOUT = 0.5


@pytest.fixture
async def strict_daemon(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    settings = Settings(limits=Limits(body_read_timeout=READ_TIMEOUT))
    async with running_daemon(Paths.resolve(), workspace, settings) as d:
        yield d


async def test_a_body_sent_too_slowly_gets_408_and_runs_nothing(strict_daemon: Daemon) -> None:
    session = await strict_daemon.new_session()
    before = strict_daemon.audit_bytes()
    headers = "".join(f"{k}: {v}\r\n" for k, v in session["headers"].items())
    head = (
        f"POST /api/v1/mcp/tools/calculate/invoke HTTP/1.1\r\nHost: 127.0.0.1:{strict_daemon.port}\r\n{headers}"
        "Content-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", strict_daemon.port)
    try:
        writer.write(head.encode() + b'{"arguments": {"expression"')  # ...and never the rest
        await writer.drain()
        async with asyncio.timeout(5 + READ_TIMEOUT):
            status, response_headers = response_head(await reader.readuntil(b"\r\n\r\n"))
            body = json.loads(await reader.readexactly(int(response_headers["content-length"])))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert status == 408
    assert body["error"]["code"] == "read_timeout"
    assert strict_daemon.audit_bytes() == before


async def test_an_oversized_header_gets_a_json_400(daemon: Daemon) -> None:
    request = (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nX-Pad: {'a' * 9000}\r\nConnection: close\r\n\r\n"
    )
    status, headers, body = await raw_request(daemon.port, request.encode())
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and "aaaa" not in error["message"]


async def test_too_many_headers_get_a_json_400(daemon: Daemon) -> None:
    padding = "".join(f"X-H{i}: v\r\n" for i in range(200))
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n{padding}Connection: close\r\n\r\n"
    status, _, body = await raw_request(daemon.port, request.encode())
    assert status == 400
    assert json.loads(body)["error"]["code"] == "bad_request"


async def test_a_duplicated_host_is_403_host_not_allowed(daemon: Daemon) -> None:
    request = (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    )
    status, _, body = await raw_request(daemon.port, request.encode())
    assert status == 403
    assert json.loads(body)["error"]["code"] == "host_not_allowed"
