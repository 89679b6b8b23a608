"""The SDK's Streamable HTTP transport and session manager, answering a marked request with one JSON body.

Why and when a request is marked: ``sidecar.edge.jsonanswer``. This is the mechanism, and it reaches
``mcp`` 2.3's private names (no public accessor exists): the private module
``mcp.server._streamable_http_modern`` (``handle_modern_request``); ``StreamableHTTPServerTransport``'s
``_handle_post_request`` (overridden), ``_read_stream_writer``, ``_request_streams``,
``_sse_stream_writers``, ``_validate_accept_header``, ``_validate_request_headers``,
``_mint_priming_event``, ``_create_session_message``, ``_clean_up_memory_streams``,
``_create_error_response``, ``_create_json_response`` and ``_run_sse_writer``;
``StreamableHTTPSessionManager``'s ``_handle_request`` and ``_admit_session`` (overridden) and
``_lifespan_state``; and the transport's class swapped at admission (same state, one method more).
``tests/unit/test_seams.py`` checks each, and ``tests/e2e/test_json_answers.py`` the behaviour.
"""

from __future__ import annotations

import logging
from functools import partial
from http import HTTPStatus
from typing import Any, Final, cast

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

__all__ = ["JSON_ANSWER", "JsonAnsweringManager", "JsonAnsweringTransport", "is_modern"]

logger = logging.getLogger(__name__)

JSON_ANSWER: Final = "sidecar.json_answer"
"""ASGI scope key: the request's parsed JSON-RPC message, when it is to be answered with one JSON body."""


class JsonAnsweringTransport(StreamableHTTPServerTransport):
    """The SDK's transport, answering a marked POST with one JSON body unless something comes before its response."""

    async def _handle_post_request(self, scope: Scope, request: Request, receive: Receive, send: Send) -> None:
        marked = scope.get(JSON_ANSWER)
        writer = self._read_stream_writer
        if marked is None or writer is None or self.is_json_response_enabled:
            await super()._handle_post_request(scope, request, receive, send)
            return
        try:
            message = jsonrpc_message_adapter.validate_python(marked, by_name=False)
        except ValidationError:
            message = None
        if not isinstance(message, JSONRPCRequest):
            await super()._handle_post_request(scope, request, receive, send)  # the SDK answers it as it would
            return
        if not await self._validate_accept_header(request, scope, send):
            return
        if not await self._validate_request_headers(request, send):
            return
        request_id = str(message.id)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        priming = await self._mint_priming_event(request_id, version)  # before dispatch, as the SDK orders it
        streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._request_streams[request_id] = streams
        try:
            await writer.send(self._create_session_message(message, request, request_id, version))
            first: EventMessage = await streams[1].receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            logger.debug("session terminated with request %s in flight; no response to send", request_id)
            await self._clean_up_memory_streams(request_id)
            response = self._create_error_response(
                "Session terminated before the request completed", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )
            await response(scope, receive, send)
            return
        except BaseException:  # aborted (revocation cancels the exchange): the stream must not outlive it
            if self._request_streams.pop(request_id, None) is not None:
                streams[0].close()
                streams[1].close()
            raise
        if isinstance(first.message, JSONRPCResponse | JSONRPCError):
            await self._clean_up_memory_streams(request_id)
            await self._create_json_response(first.message)(scope, receive, send)
            return
        await self._stream_from(first, streams[1], request_id, priming, scope, receive, send)

    async def _stream_from(
        self,
        first: EventMessage,
        rest: MemoryObjectReceiveStream[EventMessage],
        request_id: str,
        priming: SSEEvent | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """The request's SSE stream as the SDK runs it, beginning with ``first`` (already taken from ``rest``)."""
        sse_send, sse_receive = anyio.create_memory_object_stream[SSEEvent](0)
        self._sse_stream_writers[request_id] = sse_send
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
            **({MCP_SESSION_ID_HEADER: self.mcp_session_id} if self.mcp_session_id else {}),
        }
        events = cast(MemoryObjectReceiveStream[EventMessage], _Prepended(first, rest))
        response = EventSourceResponse(
            content=sse_receive,
            data_sender_callable=partial(self._run_sse_writer, request_id, sse_send, events, priming),
            headers=headers,
        )
        try:
            await response(scope, receive, send)
        finally:
            await sse_receive.aclose()


class _Prepended:
    """``rest`` as the SDK's SSE writer reads it (``async with``, ``async for``), with ``first`` before it."""

    def __init__(self, first: EventMessage, rest: MemoryObjectReceiveStream[EventMessage]) -> None:
        self._first: EventMessage | None = first
        self._rest = rest

    async def __aenter__(self) -> _Prepended:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._rest.close()

    def __aiter__(self) -> _Prepended:
        return self

    async def __anext__(self) -> EventMessage:
        first, self._first = self._first, None
        if first is not None:
            return first
        try:
            return await self._rest.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class JsonAnsweringManager(StreamableHTTPSessionManager):
    """The SDK's session manager, opening its 2025-era sessions on ``JsonAnsweringTransport``, and handing
    a marked 2026-07-28 request to the SDK's own single-exchange handler in its JSON mode."""

    async def _handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get(JSON_ANSWER) is not None and _modern_accepting_both(scope):
            # The SDK's modern handler, whole (its checks of the era's headers and envelope included), told
            # to answer in JSON: without the two tasks, stream and timer it runs to learn that nothing
            # was emitted before the result. Its JSON mode would accept a client that takes JSON only;
            # such a client is not marked, so it meets the same 406 as before.
            await handle_modern_request(
                self.app, self.security_settings, True, self._lifespan_state, scope, receive, send
            )
            return
        await super()._handle_request(scope, receive, send)

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            transport.__class__ = JsonAnsweringTransport  # same state, one method more: no copy of the SDK's body
        return transport


def is_modern(protocol_version: str | None) -> bool:
    """Whether the SDK's manager routes a request with this ``MCP-Protocol-Version`` to its 2026-07-28 handler."""
    return protocol_version is not None and protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS


def _modern_accepting_both(scope: Scope) -> bool:
    request = Request(scope)
    has_json, has_sse = check_accept_headers(request)
    return has_json and has_sse and is_modern(request.headers.get(MCP_PROTOCOL_VERSION_HEADER))
