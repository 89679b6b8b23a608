"""A small ASGI bridge: hand one aiohttp request to an ASGI app (the MCP SDK's session manager).

Why our own: the ``aiohttp-asgi`` package never reports ``http.disconnect`` and spins at EOF, which
wedges the SDK's disconnect watchers. Here ``receive()`` hands over the body
once, then blocks until the client goes away or the request is aborted; writes after a disconnect are
dropped, as uvicorn does. The body is read by the caller, bounded in size, time and depth, before the
app sees it.

An aborted exchange (revocation) ends at once. If its answer had begun (an SSE stream) the connection
is closed mid-answer; if nothing had been sent yet (a request answered in one JSON body, still
running) the request gets a 403 whose body is the JSON-RPC error for its id, so a client can fail that
one request and keep its connection, rather than meet a socket closed with no response at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from aiohttp import web
from mcp_types import INVALID_REQUEST

__all__ = ["AsgiApp", "AsgiExchange", "DisconnectWatcher"]

logger = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
AsgiApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

ABORTED: Final = "the request was aborted: its session, route or connector was revoked"
"""The JSON-RPC error message of a request aborted before its answer began."""
DISCONNECT_POLL: Final = 0.25
"""Seconds between checks that the client is still connected (aiohttp has no disconnect callback)."""


class AsgiExchange:
    """One request/response exchange between aiohttp and an ASGI app. ``abort()`` ends it at once."""

    def __init__(
        self,
        request: web.Request,
        body: bytes,
        extra_scope: dict[str, Any],
        *,
        watcher: DisconnectWatcher,
        request_id: str | int | None = None,
    ) -> None:
        """``request_id``: the JSON-RPC id of the request in ``body``, if it is one (an abort answers it)."""
        self._watcher = watcher
        self._request = request
        self._body: bytes | None = body
        self._extra = extra_scope
        self._gone = asyncio.Event()
        self._response: web.StreamResponse | None = None
        self._request_id = request_id
        self._task: asyncio.Task[Any] | None = None
        self._refused = False

    def abort(self) -> None:
        """Revocation: the app sees ``http.disconnect``; the client gets its request's error (nothing sent yet)
        or sees its connection end (an answer under way)."""
        self._gone.set()
        if self._response is None and self._request_id is not None and self._task is not None:
            self._refused = True
            self._task.cancel()  # run() answers for the app
            return
        transport = self._request.transport
        if transport is not None:
            transport.close()

    async def run(self, app: AsgiApp) -> web.StreamResponse:
        self._watcher.add(self)
        self._task = asyncio.current_task()
        try:
            await app(self._scope(), self._receive, self._send)
        except asyncio.CancelledError:
            if not self._refused or self._task is None:
                raise
            self._task.uncancel()
            error = {"jsonrpc": "2.0", "id": self._request_id, "error": {"code": INVALID_REQUEST, "message": ABORTED}}
            return web.json_response(error, status=403)
        finally:
            self._task = None
            self._watcher.discard(self)
        if self._response is None:
            # The app ended without answering (only when the client left first): nothing to send.
            return web.Response(status=499 if self._gone.is_set() else 500)
        if self._response.prepared and not self._gone.is_set():
            with contextlib.suppress(ConnectionError):
                await self._response.write_eof()
        return self._response

    def check_connection(self) -> None:
        """Called by the shared watcher: notice a client that hung up."""
        transport = self._request.transport
        if transport is None or transport.is_closing():
            self._gone.set()

    def _scope(self) -> dict[str, Any]:
        request = self._request
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport else None
        sock = transport.get_extra_info("sockname") if transport else None
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.rel_url.raw_path.encode("latin-1"),
            "query_string": request.rel_url.raw_query_string.encode("latin-1"),
            "root_path": "",
            "headers": [(name.lower(), value) for name, value in request.raw_headers],
            "client": tuple(peer[:2]) if peer else None,
            "server": tuple(sock[:2]) if sock else None,
            "state": {},
        }
        scope.update(self._extra)
        return scope

    async def _receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self._gone.is_set():
            return  # the client is gone: drop, as uvicorn does
        kind = message["type"]
        try:
            if kind == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                self._response = response
                # SSE needs the headers on the wire before the first event.
                await response.prepare(self._request)
            elif kind == "http.response.body" and self._response is not None:
                body = message.get("body", b"")
                if body:
                    await self._response.write(body)
                if not message.get("more_body", False):
                    await self._response.write_eof()
        except (ConnectionError, RuntimeError) as exc:
            logger.debug("client went away while writing: %s", exc)
            self._gone.set()


class DisconnectWatcher:
    """One task for all open exchanges, polling their transports (aiohttp has no disconnect callback).

    A task per request cost more than the request's own routing; one shared poll costs a set walk.
    """

    def __init__(self) -> None:
        self._exchanges: set[AsgiExchange] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, exchange: AsgiExchange) -> None:
        self._exchanges.add(exchange)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll(), name="asgi-disconnect-watcher")

    def discard(self, exchange: AsgiExchange) -> None:
        self._exchanges.discard(exchange)

    async def _poll(self) -> None:
        while self._exchanges:
            await asyncio.sleep(DISCONNECT_POLL)
            for exchange in list(self._exchanges):
                exchange.check_connection()

    async def close(self) -> None:
        """Stop polling (at shutdown); exchanges still open are left to their own aborts."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
