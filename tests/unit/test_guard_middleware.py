"""The guard middleware on a real aiohttp server on 127.0.0.1:0, driven by hand-written raw HTTP requests.

Raw sockets, not a client library: the cases (no Host on HTTP/1.0, absolute-form targets, duplicated
headers) are exactly the ones a client library would normalise away.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from sidecar.config import parse_origin
from sidecar.net.guard import add_vary_origin, make_guard_middleware
from tests.helpers import response_head

ALLOWED_ORIGIN = "http://localhost:5173"
EXEMPT_PATH = "/oauth/callback"
TOKEN = "tok_SECRET_do_not_log_0123456789abcdef"
IO_TIMEOUT = 5.0  # seconds for one whole request/response exchange on loopback


@dataclass
class Server:
    port: int
    hits: list[str] = field(default_factory=list)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json_error_code(self) -> object:
        payload = json.loads(self.body)
        return payload["error"]["code"]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    hits: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="ok")

    runner_box: list[web.AppRunner] = []
    guard = make_guard_middleware(
        port=lambda: runner_box[0].addresses[0][1],  # known only after bind, as in the daemon
        allowed_origins=frozenset({parse_origin(ALLOWED_ORIGIN)}),
        fetch_site_exempt=lambda path: path == EXEMPT_PATH,
    )
    app = web.Application(middlewares=[guard])
    app.on_response_prepare.append(add_vary_origin)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    runner_box.append(runner)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield Server(port=runner.addresses[0][1], hits=hits)
    finally:
        async with asyncio.timeout(IO_TIMEOUT):
            await runner.cleanup()


async def send(port: int, request_line: str, headers: list[str]) -> Reply:
    """Send one raw request (``Connection: close`` added on HTTP/1.1) and read one reply.

    The body is read by ``Content-Length`` (to EOF only without one): aiohttp's pure-Python parser keeps
    a ``CONNECT`` connection open after answering it.
    """
    lines = [request_line, *headers]
    if request_line.endswith("HTTP/1.1"):
        lines.append("Connection: close")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    async with asyncio.timeout(IO_TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(raw)
            await writer.drain()
            status, parsed = response_head(await reader.readuntil(b"\r\n\r\n"))
            length = parsed.get("content-length")
            body = await (reader.readexactly(int(length)) if length is not None else reader.read())
        finally:
            writer.close()
            await writer.wait_closed()
    return Reply(status=status, headers=parsed, body=body)


def assert_refused(reply: Reply, server: Server, *, status: int = 403) -> None:
    assert reply.status == status, reply
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json_error_code()
    assert b"Traceback" not in reply.body
    assert server.hits == []
    assert not any(name.startswith("access-control-") for name in reply.headers)


def good_host(server: Server) -> str:
    return f"Host: 127.0.0.1:{server.port}"


# --- requests that pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
async def test_a_loopback_host_with_the_listening_port_reaches_the_handler(server: Server, host: str) -> None:
    reply = await send(server.port, "GET /hit HTTP/1.1", [f"Host: {host}:{server.port}"])
    assert reply.status == 200
    assert reply.body == b"ok"
    assert server.hits == ["/hit"]
    assert reply.headers["vary"] == "Origin"
    assert not any(name.startswith("access-control-") for name in reply.headers)


async def test_an_allowed_origin_reaches_the_handler(server: Server) -> None:
    reply = await send(server.port, "POST /hit HTTP/1.1", [good_host(server), f"Origin: {ALLOWED_ORIGIN}"])
    assert reply.status == 200
    assert server.hits == ["/hit"]


async def test_same_origin_fetch_reaches_the_handler(server: Server) -> None:
    reply = await send(server.port, "GET /hit HTTP/1.1", [good_host(server), "Sec-Fetch-Site: same-origin"])
    assert reply.status == 200
    assert server.hits == ["/hit"]


async def test_the_exempt_path_accepts_a_cross_site_navigation(server: Server) -> None:
    reply = await send(
        server.port, f"GET {EXEMPT_PATH}?code=x HTTP/1.1", [good_host(server), "Sec-Fetch-Site: cross-site"]
    )
    assert reply.status == 200
    assert server.hits == [EXEMPT_PATH]


# --- requests that are refused ---------------------------------------------------------------------


async def test_http10_without_host_is_refused(server: Server) -> None:
    reply = await send(server.port, "GET /hit HTTP/1.0", [])
    assert_refused(reply, server)
    assert reply.json_error_code() == "host_not_allowed"
    assert reply.headers["vary"] == "Origin"


async def test_duplicate_host_is_refused_before_the_handler(server: Server) -> None:
    reply = await send(server.port, "GET /hit HTTP/1.1", [good_host(server), good_host(server)])
    # aiohttp's parser answers this one itself (400, plain text) before any middleware runs.
    assert 400 <= reply.status < 500
    assert b"Traceback" not in reply.body
    assert server.hits == []


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{wrong}",
        "127.0.0.1",
        "evil.com",
        "evil.com:{port}",
        "user@127.0.0.1:{port}",
        "127.0.0.1:{port}.",
        "127.0.0.1:{port}, evil",
    ],
)
async def test_a_host_other_than_loopback_with_the_listening_port_is_refused(server: Server, host: str) -> None:
    value = host.format(port=server.port, wrong=server.port + 1 if server.port < 65535 else 1)
    reply = await send(server.port, "GET /hit HTTP/1.1", [f"Host: {value}"])
    assert_refused(reply, server)
    assert reply.json_error_code() == "host_not_allowed"


@pytest.mark.parametrize(
    "request_line",
    [
        "GET http://evil.com/hit HTTP/1.1",
        "GET http://127.0.0.1:{port}/hit HTTP/1.1",
        "GET //evil.com/hit HTTP/1.1",
        "OPTIONS * HTTP/1.1",
        "CONNECT evil.com:443 HTTP/1.1",
    ],
)
async def test_a_target_that_is_not_origin_form_is_refused_even_with_a_good_host(
    server: Server, request_line: str
) -> None:
    reply = await send(server.port, request_line.format(port=server.port), [good_host(server)])
    assert_refused(reply, server)


async def test_an_absolute_form_mcp_target_gets_a_json_rpc_shaped_refusal(server: Server) -> None:
    reply = await send(server.port, "POST http://evil.com/mcp HTTP/1.1", [good_host(server)])
    assert_refused(reply, server)
    error = json.loads(reply.body)["error"]
    assert error["data"] == "host_not_allowed"


@pytest.mark.parametrize(
    "origin", ["null", "http://evil.com", "http://localhost:51730", "http://localhost:5173/path", ""]
)
async def test_an_origin_not_exactly_allowed_is_refused(server: Server, origin: str) -> None:
    reply = await send(server.port, "POST /hit HTTP/1.1", [good_host(server), f"Origin: {origin}"])
    assert_refused(reply, server)
    assert reply.json_error_code() == "origin_not_allowed"


async def test_two_origin_headers_are_refused(server: Server) -> None:
    reply = await send(
        server.port,
        "POST /hit HTTP/1.1",
        [good_host(server), f"Origin: {ALLOWED_ORIGIN}", f"Origin: {ALLOWED_ORIGIN}"],
    )
    assert_refused(reply, server)


@pytest.mark.parametrize("site", ["cross-site", "same-site", "Cross-Site"])
async def test_a_cross_site_or_same_site_fetch_is_refused(server: Server, site: str) -> None:
    reply = await send(server.port, "GET /hit HTTP/1.1", [good_host(server), f"Sec-Fetch-Site: {site}"])
    assert_refused(reply, server)
    assert reply.json_error_code() == "cross_site_request"


async def test_the_exempt_path_still_checks_host(server: Server) -> None:
    reply = await send(server.port, f"GET {EXEMPT_PATH} HTTP/1.1", ["Host: evil.com", "Sec-Fetch-Site: cross-site"])
    assert_refused(reply, server)


# --- logging ---------------------------------------------------------------------------------------


async def test_a_refusal_logs_one_warning_with_the_value_and_never_the_token(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reply = await send(
        server.port,
        "GET /hit?code=QUERYSECRET HTTP/1.1",
        [f"Host: evil.example:{server.port}", f"Authorization: Bearer {TOKEN}"],
    )
    assert_refused(reply, server)
    warnings = [r for r in caplog.records if r.name == "sidecar.net.guard" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    line = warnings[0].getMessage()
    assert f"'evil.example:{server.port}'" in line
    assert "\n" not in line
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("sidecar"))
    assert TOKEN not in caplog.text + reply.body.decode()
    # aiohttp's own access log prints the request line with its query; the daemon must configure that.
    assert "QUERYSECRET" not in ours + reply.body.decode()


async def test_the_logged_value_is_truncated(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    reply = await send(server.port, "GET /hit HTTP/1.1", [f"Host: {'e' * 4000}"])
    assert_refused(reply, server)
    (record,) = [r for r in caplog.records if r.name == "sidecar.net.guard"]
    assert "e" * 101 not in record.getMessage()
