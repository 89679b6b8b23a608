"""Every private name of a dependency that ``sidecar/seams`` reaches: it exists, has the shape relied
upon, and does what the seam says. An upgrade of ``mcp`` or ``aiohttp`` that moves one fails here first.

The behaviour built on them is tested through the daemon as well: the JSON answers in
``tests/e2e/test_json_answers.py``, the head deadline and JSON parser errors in
``tests/security/test_slow_clients.py`` and ``test_front_door.py``, the raw call in
``tests/unit/test_rawcall.py``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from mcp import ClientSession
from mcp.server import Server, ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.session import ServerSession
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from sidecar.seams.aiohttp_server import ConnectionHandler, HandlerRunner
from sidecar.seams.asyncio_subprocess import close_subprocess_transport
from sidecar.seams.sdk_client import client_dispatcher, stamp_request
from sidecar.seams.sdk_server import request_channels


def _parameters(function: Callable[..., Any]) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


# --- mcp: the Streamable HTTP transport and its manager (seams/sdk_streamable.py) -----------------------

TRANSPORT_METHODS = {
    # name: (a coroutine function?, its parameters in order)
    "_handle_post_request": (True, ["scope", "request", "receive", "send"]),
    "_validate_accept_header": (True, ["request", "scope", "send"]),
    "_validate_request_headers": (True, ["request", "send"]),
    "_mint_priming_event": (True, ["stream_id", "protocol_version"]),
    "_create_session_message": (False, ["message", "request", "request_id", "protocol_version"]),
    "_clean_up_memory_streams": (True, ["request_id"]),
    "_create_error_response": (False, ["error_message", "status_code", "error_code", "headers"]),
    "_create_json_response": (False, ["response_message", "status_code", "headers"]),
    "_run_sse_writer": (True, ["request_id", "sse_stream_writer", "request_stream_reader", "priming_event"]),
}


@pytest.mark.parametrize("name", sorted(TRANSPORT_METHODS))
def test_the_transports_private_methods_keep_their_shape(name: str) -> None:
    is_coroutine, parameters = TRANSPORT_METHODS[name]
    method = getattr(StreamableHTTPServerTransport, name)
    assert (inspect.iscoroutinefunction(method), _parameters(method)) == (is_coroutine, parameters)


def test_the_transport_keeps_its_streams_where_the_seam_reads_them() -> None:
    transport = StreamableHTTPServerTransport(mcp_session_id="s")
    assert transport._read_stream_writer is None  # set once the transport's streams are connected
    assert transport._request_streams == {} and transport._sse_stream_writers == {}
    assert isinstance(transport.is_json_response_enabled, bool) and transport.mcp_session_id == "s"


def test_the_manager_hands_requests_and_admits_sessions_where_the_seam_hooks_in() -> None:
    manager = StreamableHTTPSessionManager(app=Server("probe"))
    assert inspect.iscoroutinefunction(StreamableHTTPSessionManager._handle_request)
    assert _parameters(StreamableHTTPSessionManager._handle_request) == ["scope", "receive", "send"]
    assert _parameters(StreamableHTTPSessionManager._admit_session) == ["requestor"]
    assert hasattr(manager, "_lifespan_state") and manager.app is not None and hasattr(manager, "security_settings")


def test_the_modern_handler_is_where_the_seam_imports_it_from() -> None:
    from mcp.server._streamable_http_modern import handle_modern_request

    assert inspect.iscoroutinefunction(handle_modern_request)
    assert _parameters(handle_modern_request) == [
        "app", "security_settings", "json_response", "lifespan_state", "scope", "receive", "send"
    ]  # fmt: skip


def test_an_admitted_transport_can_take_the_json_answering_class() -> None:
    # The swap keeps every attribute: the subclass adds behaviour only, no state and no __slots__.
    from sidecar.seams.sdk_streamable import JsonAnsweringTransport

    transport = StreamableHTTPServerTransport(mcp_session_id="s")
    state = dict(vars(transport))
    transport.__class__ = JsonAnsweringTransport
    assert vars(transport) == state
    assert "__slots__" not in vars(JsonAnsweringTransport)


# --- mcp: the client session (seams/sdk_client.py) and the server session (seams/sdk_server.py) ---------


class _Outbound:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    async def send_raw_request(self, method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        self.sent.append((method, params, opts))
        return {"raw": True}

    async def notify(self, method: str, params: Any, opts: Any = None) -> None:
        return None


async def test_the_client_sessions_stamp_and_dispatcher_are_where_the_seam_reads_them() -> None:
    outbound = _Outbound()
    client = ClientSession(dispatcher=outbound)  # type: ignore[arg-type]
    assert client_dispatcher(client) is outbound
    data: dict[str, Any] = {"method": "tools/call", "params": {"name": "x", "arguments": {}}}
    opts: Any = {}
    stamp_request(client, data, opts)  # before the handshake: the SDK's pre-connect stamp, which adds nothing
    assert data == {"method": "tools/call", "params": {"name": "x", "arguments": {}}}
    assert await client_dispatcher(client).send_raw_request("tools/call", data["params"], opts) == {"raw": True}


def test_the_relay_reaches_the_raw_request_channel_and_the_connection() -> None:
    request_channel, standalone = _Outbound(), _Outbound()
    connection = Connection(standalone, protocol_version="2025-11-25", session_id="abc")  # type: ignore[arg-type]
    session = ServerSession(request_channel, connection)  # type: ignore[arg-type]
    ctx: ServerRequestContext[Any, Any] = ServerRequestContext(
        session=session, lifespan_context={}, protocol_version="2025-11-25", method="tools/list", request_id=1
    )
    channel, found = request_channels(ctx)
    assert channel is request_channel
    assert found is connection and found.outbound is standalone
    found.state["k"] = 1
    assert connection.state == {"k": 1}  # per-connection state the relay keeps its upstream in


# --- aiohttp: the connection handler and the runner (seams/aiohttp_server.py) ---------------------------


def test_the_request_handler_keeps_the_parser_state_the_seam_reads() -> None:
    for name in ("_request_count", "_request_in_progress", "_messages"):
        assert name in RequestHandler.__slots__, name
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    assert _parameters(web.AppRunner._make_server) == []
    assert _parameters(web.Server.__call__) == []


async def test_the_runner_serves_each_connection_with_our_handler() -> None:
    made: list[ConnectionHandler] = []

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = HandlerRunner(app, handler_class=ConnectionHandler, configure=made.append)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await runner.cleanup()
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"hi")
    [handler] = made
    assert type(handler) is ConnectionHandler
    assert (handler.requests_parsed, handler.busy) == (1, False)
    assert handler.event_loop is asyncio.get_running_loop()


# --- asyncio: the subprocess transport (seams/asyncio_subprocess.py) ------------------------------------


def test_the_subprocess_transport_is_where_the_seam_closes_it() -> None:
    class Transport:
        closed = False

        def get_pid(self) -> int:
            return 0

        def close(self) -> None:
            self.closed = True

    class Protocol:
        stdin = stdout = stderr = None

    transport = Transport()
    loop = asyncio.new_event_loop()
    try:
        proc = asyncio.subprocess.Process(transport, Protocol(), loop)  # type: ignore[arg-type]
    finally:
        loop.close()
    assert proc._transport is transport
    close_subprocess_transport(proc)
    assert transport.closed
