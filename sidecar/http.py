"""The HTTP edge's error mapping: every ``SidecarError`` becomes one JSON body with its status.

Routes under ``/mcp`` answer in JSON-RPC shape (``{"jsonrpc","id":null,"error":{code,message}}``) so MCP
clients show the message; every other route answers ``{"error": {"code", "message"}}``. Anything that is
not a ``SidecarError`` is logged with its traceback here and answered with a bare 500: internals never
reach the client.

**Every error body is inert** (issue 11 item 3), whoever raised it and whatever its message quotes:

* it is JSON with ``Content-Type: application/json`` and ``X-Content-Type-Options: nosniff`` (so no
  browser renders it as a page), ``Cache-Control: no-store``, and it is the same for aiohttp's own 404
  and 405, for the HTTP parser's refusals and for a 500;
* it is ASCII: every control character, DEL, bidi control and non-ASCII character is a JSON ``\\uXXXX``
  escape, and so are ``<``, ``>`` and ``&`` (``\\u003c``…), so that no ``<script>`` appears in its bytes;
* its message is at most ``MAX_MESSAGE`` characters.

Messages name what is wrong rather than quoting the request (``sidecar.errors``); these three rules hold
for a message that quotes a value anyway (a tool or connector name that helps the user).
``add_security_headers`` puts ``nosniff`` on every other response too (the MCP SDK's own JSON errors,
SSE streams).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Final, cast

from aiohttp import hdrs, web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.typedefs import Handler
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
from sidecar.seams.aiohttp_server import ConnectionHandler, HandlerRunner

__all__ = [
    "MAX_MESSAGE",
    "JsonErrorRunner",
    "add_security_headers",
    "error_json",
    "error_middleware",
    "error_response",
    "json_response",
]

logger = logging.getLogger(__name__)

Admit = Callable[[asyncio.BaseTransport], Callable[[], None] | None]
"""Decides at accept whether a connection may be served; ``None``: it was refused (and reset)."""

MAX_MESSAGE: Final = 1024
"""Characters of an error message in a response; a longer one is cut and ends ``...``. Messages are
sentences of at most a few hundred characters (a validation report of several fields is the longest):
this bound is the last guard against one that quotes a large value."""

# JSON-RPC code per HTTP status for MCP-shaped errors (MCP has no registry of its own for these).
_JSONRPC_CODES = {400: -32600, 401: -32001, 403: -32003, 404: -32004, 408: -32000, 413: -32600, 415: -32600}
_PARSE_ERROR = -32700  # JSON-RPC 2.0: invalid JSON was received
_CUT: Final = "..."
_HTML_SPECIALS: Final = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
"""After ``json.dumps(ensure_ascii=True)`` these three can only sit inside strings, where a ``\\u``
escape means the same character (RFC 8259 §7): the document is unchanged, its bytes hold no markup."""
_ERROR_HEADERS: Final = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def json_response(payload: object, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return web.Response(text=body, status=status, content_type="application/json", charset="utf-8", headers=headers)


def error_json(payload: object) -> str:
    """``payload`` as an error body: compact ASCII JSON with ``<``, ``>`` and ``&`` escaped too."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=True).translate(_HTML_SPECIALS)


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - len(_CUT)] + _CUT


def _render(
    path: str,
    status: int,
    code: str,
    message: str,
    *,
    rpc_code: int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """The one error body: JSON-RPC shaped under ``/mcp``, ``{"error": ...}`` elsewhere; inert either way."""
    message = _bounded(message or code)
    body: dict[str, object]
    if path == "/mcp" or path.startswith("/mcp/"):
        rpc = rpc_code if rpc_code is not None else _JSONRPC_CODES.get(status, -32603)
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": rpc, "message": message, "data": code}}
    else:
        body = {"error": {"code": code, "message": message}}
    return web.Response(
        text=error_json(body),
        status=status,
        content_type="application/json",
        charset="utf-8",
        headers={**_ERROR_HEADERS, **(headers or {})},
    )


def error_response(path: str, err: SidecarError) -> web.Response:
    """The one place a ``SidecarError`` turns into an HTTP response."""
    headers = {}
    if isinstance(err, Unauthorized):
        # RFC 6750 §3: tell the client which scheme to use, nothing more.
        headers["WWW-Authenticate"] = 'Bearer realm="sidecar"'
    rpc_code = _PARSE_ERROR if isinstance(err, MalformedJson) else None
    return _render(path, err.status, err.code, str(err), rpc_code=rpc_code, headers=headers)


def _http_exception_response(path: str, exc: web.HTTPException) -> web.Response:
    """aiohttp's own refusals (404 for an unknown path, 405 for an unknown method, 413 ...) in our shape.

    The message is the status's reason phrase, never the path or method that was refused.
    """
    reason = exc.reason or "error"
    code = reason.lower().replace(" ", "_")
    allow = exc.headers.get(hdrs.ALLOW)
    return _render(path, exc.status, code, reason, headers={hdrs.ALLOW: allow} if allow is not None else None)


def _internal_error(path: str) -> web.Response:
    return _render(path, 500, "internal_error", "internal error")


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: ``X-Content-Type-Options: nosniff`` on every response, so that no
    answer (the SDK's own JSON errors, a tool result that quotes markup) is ever sniffed into HTML."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")


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
            return _http_exception_response(request.path, exc)
        raise
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return _internal_error(request.path)


class _Connection(ConnectionHandler):
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
    admit: Admit | None = None
    _head_timer: asyncio.TimerHandle | None = None
    _release: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.admit is not None:
            self._release = self.admit(transport)
            if self._release is None:
                return  # refused and reset at accept (sidecar.net.frontdoor): aiohttp never sees it
        super().connection_made(transport)
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        heads = self.requests_parsed
        super().data_received(data)
        if self.requests_parsed != heads:  # the parser produced a request: its head is complete
            self._disarm_head_deadline()
        elif self._head_timer is None and not self.busy:
            self._arm_head_deadline()  # the first bytes of a later request's head

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.admit is not None and self._release is None:
            return  # refused at accept: nothing of aiohttp's was set up
        self._disarm_head_deadline()
        try:
            super().connection_lost(exc)
        finally:
            if self._release is not None:
                self._release()

    def _arm_head_deadline(self) -> None:
        self._head_timer = self.event_loop.call_later(self.head_timeout, self._head_expired)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or self.busy:
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
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        if status >= 500:
            # aiohttp's own would answer an HTML page (with a traceback in debug mode).
            logger.error("error handling a request from %s", request.remote, exc_info=exc)
            response = _internal_error("/")
            response.force_close()
            return response
        # SECURITY: aiohttp's own handler logs the parser error, whose text quotes header bytes (an
        # oversized "Authorization: Bearer <token> ..." would land in the log). Log the kind only.
        logger.warning("HTTP parser refused a request from %s: %s", request.remote, type(exc).__name__)
        if isinstance(exc, BadHttpMessage) and "'host'" in str(exc).lower():
            response = error_response("/", HostRejected("exactly one Host header is allowed"))
        else:
            # The parser's message may quote header bytes too; say what was wrong without echoing them.
            what = "a header line is too long" if isinstance(exc, LineTooLong) else "malformed HTTP request"
            response = _render("/", status, RequestRejected.code, what)
        response.force_close()
        return response


def _raw_408() -> bytes:
    body = error_json({"error": {"code": ReadTimedOut.code, "message": "request head not received in time"}})
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


class JsonErrorRunner(HandlerRunner):
    """``web.AppRunner`` whose connections bound the head read and answer parser rejections as JSON.

    ``admit`` (``sidecar.net.frontdoor.FrontDoor.admit``) is asked once per connection, before aiohttp
    sees it: ``None`` means it was refused and reset; otherwise it is called back when the connection ends.
    """

    def __init__(self, app: web.Application, *, head_timeout: float, admit: Admit | None = None, **kwargs: Any) -> None:
        def configure(connection: ConnectionHandler) -> None:
            ours = cast(_Connection, connection)
            ours.head_timeout = head_timeout
            ours.admit = admit

        super().__init__(app, handler_class=_Connection, configure=configure, **kwargs)
