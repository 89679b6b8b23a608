"""The HTTP edge's error mapping: every ``SidecarError`` becomes one JSON body with its status.

Routes under ``/mcp`` answer in JSON-RPC shape (``{"jsonrpc","id":null,"error":{code,message}}``) so MCP
clients show the message; every other route answers ``{"error": {"code", "message"}}``. Anything that is
not a ``SidecarError`` is logged with its traceback here and answered with a bare 500: internals never
reach the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from sidecar.errors import (
    BodyTooLarge,
    HostRejected,
    MalformedJson,
    ReadTimedOut,
    RequestRejected,
    SidecarError,
    Unauthorized,
)

__all__ = ["JsonErrorRunner", "error_middleware", "error_response", "json_response"]

logger = logging.getLogger(__name__)

# JSON-RPC code per HTTP status for MCP-shaped errors (MCP has no registry of its own for these).
_JSONRPC_CODES = {400: -32600, 401: -32001, 403: -32003, 404: -32004, 408: -32000, 413: -32600, 415: -32600}
_PARSE_ERROR = -32700  # JSON-RPC 2.0: invalid JSON was received


def json_response(payload: object, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return web.Response(text=body, status=status, content_type="application/json", charset="utf-8", headers=headers)


def error_response(path: str, err: SidecarError) -> web.Response:
    """The one place a ``SidecarError`` turns into an HTTP response."""
    headers = {"Cache-Control": "no-store"}
    if isinstance(err, Unauthorized):
        # RFC 6750 §3: tell the client which scheme to use, nothing more.
        headers["WWW-Authenticate"] = 'Bearer realm="sidecar"'
    message = str(err) or err.code
    if path == "/mcp" or path.startswith("/mcp/"):
        code = _PARSE_ERROR if isinstance(err, MalformedJson) else _JSONRPC_CODES.get(err.status, -32603)
        body: dict[str, object] = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": code, "message": message, "data": err.code},
        }
    else:
        body = {"error": {"code": err.code, "message": message}}
    return json_response(body, status=err.status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: render our errors, hide everything else behind a bare 500."""
    try:
        return await handler(request)
    except SidecarError as err:
        response = error_response(request.path, err)
        if isinstance(err, BodyTooLarge | ReadTimedOut):
            # The body was not read to its end: close instead of draining it (aiohttp would linger).
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status >= 400:
            reason = exc.reason or "error"
            code = reason.lower().replace(" ", "_")
            return json_response({"error": {"code": code, "message": reason}}, status=exc.status)
        raise
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return json_response({"error": {"code": "internal_error", "message": "internal error"}}, status=500)


class _Connection(RequestHandler):  # type: ignore[misc]
    """aiohttp's connection handler, with a deadline on each request's head and JSON rejections.

    **Head deadline.** aiohttp bounds neither the wait for a new connection's first request nor a head
    sent a byte at a time: either holds a socket, and its handler task, forever. Here the line and
    header fields of a request must arrive within ``head_timeout`` seconds, counted from the connection
    (first request) or from the request's first byte (later requests on a kept-alive connection; an
    idle one between requests is aiohttp's keep-alive timeout's). Late: a JSON 408, and the connection
    is closed. One timer per connection, armed and disarmed from ``data_received``; nothing per route.

    **Parser rejections.** aiohttp's HTTP parser refuses some requests before any middleware runs (a
    duplicated singleton header such as ``Host``, an oversized header line, a malformed request line)
    and answers them in plain text. The contract wants a JSON error, and a 403 for a duplicated ``Host``.
    """

    head_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:  # the parser produced a request: its head is complete
            self._disarm_head_deadline()
        elif self._head_timer is None and not self._request_in_progress and not self._messages:
            self._arm_head_deadline()  # the first bytes of a later request's head

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._head_timer = self._loop.call_later(self.head_timeout, self._head_expired)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or self._request_in_progress or self._messages:
            return
        # SECURITY: a client that never finishes its head must not hold a socket and a task forever.
        logger.info("cut off a connection that sent no complete request head within %gs", self.head_timeout)
        transport.write(_RAW_408)
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        # SECURITY: aiohttp's own handler logs the parser error, whose text quotes header bytes (an
        # oversized "Authorization: Bearer <token> ..." would land in the log). Log the kind only.
        logger.warning("HTTP parser refused a request from %s: %s", request.remote, type(exc).__name__)
        if isinstance(exc, BadHttpMessage) and "'host'" in str(exc).lower():
            response = error_response("/", HostRejected("exactly one Host header is allowed"))
        else:
            # The parser's message may quote header bytes too; say what was wrong without echoing them.
            what = "a header line is too long" if isinstance(exc, LineTooLong) else "malformed HTTP request"
            response = json_response({"error": {"code": RequestRejected.code, "message": what}}, status=status)
        response.force_close()
        return response


def _raw_408() -> bytes:
    body = json.dumps({"error": {"code": ReadTimedOut.code, "message": "request head not received in time"}})
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        "X-Content-Type-Options: nosniff\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode("ascii")


_RAW_408: Final = _raw_408()


class _Server(web.Server):
    head_timeout: float = 10.0

    def __call__(self) -> RequestHandler:
        connection = _Connection(self, loop=self._loop, **self._kwargs)
        connection.head_timeout = self.head_timeout
        return connection


class JsonErrorRunner(web.AppRunner):
    """``web.AppRunner`` whose connections bound the head read and answer parser rejections as JSON."""

    def __init__(self, app: web.Application, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout = head_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The Server is built by Application._make_handler; swapping its class only changes which
        # RequestHandler it creates per connection.
        server.__class__ = _Server
        cast(_Server, server).head_timeout = self._head_timeout
        return server
