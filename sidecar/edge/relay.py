"""``/mcp/connectors/<id>``: one connector relayed faithfully, as if the client talked to it directly.

Requests and results pass as they are (raw JSON-RPC, not re-typed), under new request ids that the
connection's dispatcher maps back; a client's cancel reaches the connector under the connector's id, and
progress comes back under the client's token. What the connector sends on its own (logging,
sampling, elicitation, roots, list-changed, resource updates) goes to the client exchange that is
waiting on it, or to the client's standalone stream when none is.

Protocol eras are kept end to end. A 2025-era MCP session gets a connector connection of its own,
opened by relaying its ``initialize`` and closed with the session: per-connection state such as the
log level, subscriptions and server→client requests then belongs to exactly one client. 2026-07-28
requests are self-contained, so one connection per (sidecar session, connector) serves them all.

Policy still holds on this route: the route exists only while the connector is trusted, a session that
may not use the connector at all (its grant names none of it, or it lacks the network the connector
needs) is refused before anything starts, every call goes through ``ToolService.call`` (the one
decision, approvals, billing, audit, abort on revocation), ``tools/list`` shows only tools this session
may call and that have not changed since trust, and resources and prompts need the session's grant of
the connector (as on ``/mcp``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, NamedTuple, cast

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.connection import Connection
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PARAM_HEADER_PREFIX,
    MCP_PROTOCOL_VERSION_HEADER,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, RequestId
from mcp_types.methods import serialize_server_result

from sidecar.auth.routes import route_key
from sidecar.auth.sessions import Session, SessionStore
from sidecar.bus.policy import grants_connector, reaches_connector
from sidecar.bus.registry import CallContext, ToolOutput
from sidecar.bus.tools import ToolService
from sidecar.connectors.launch import START_TIMEOUT
from sidecar.connectors.manager import Connector
from sidecar.connectors.proxy import withheld_message
from sidecar.connectors.relayed import RelayedConnection, Sink
from sidecar.connectors.service import ConnectorService
from sidecar.edge.mcp import CALLER, elicitation_asker, principal_of
from sidecar.errors import SidecarError, ToolError
from sidecar.names import connector_of_route, connector_tool
from sidecar.seams.sdk_server import request_channels

__all__ = ["Relay"]

logger = logging.getLogger(__name__)

_STATE_KEY: Final = "sidecar.relay"
_UNGATED: Final = frozenset({"ping", "logging/setLevel", "server/discover", "tools/list"})
"""Requests any live session that may use the connector at all may send: they reach no resource or prompt,
and tools are filtered (``tools/list``) or decided (``tools/call``) one by one, as a grant may name single
tools."""
_ROUTING_HEADERS: Final = frozenset({MCP_PROTOCOL_VERSION_HEADER, MCP_METHOD_HEADER, MCP_NAME_HEADER})
_PARAM_PREFIX: Final = MCP_PARAM_HEADER_PREFIX.lower()  # header names arrive lower-cased (ASGI)
_NOT_RELAYED: Final = frozenset({"notifications/cancelled", "notifications/progress"})
"""Client notifications the dispatchers already turned into the connector's own ids."""


class Relay:
    """The SDK server behind ``/mcp/connectors/<id>``; its connector connections are ``RelayedConnections``."""

    def __init__(
        self,
        *,
        connectors: ConnectorService,
        tools: ToolService,
        sessions: SessionStore,
    ) -> None:
        self._manager = connectors.manager
        self._connector_tools = connectors.tools
        self._relayed = connectors.relayed
        self._tools = tools
        self._sessions = sessions

    # -- the SDK server ----------------------------------------------------------------------------

    def server(self) -> Server[Any]:
        async def never_called(ctx: ServerRequestContext[Any, Any], params: Any) -> Any:
            raise AssertionError("the relay middleware answers every request")

        def input_schema(name: str) -> dict[str, Any] | None:
            # 2026-07-28 Mcp-Param-* headers are checked against the schema approved at trust.
            principal = CALLER.get()
            session = self._sessions.alive(principal.session_id) if principal is not None else None
            if principal is None or session is None:
                return None
            tool = self._tools.lookup(session, connector_tool(_connector_id(principal.route), name))
            return dict(tool.input_schema) if tool is not None else None

        server: Server[Any] = Server("sidecar-relay", on_list_tools=never_called, get_tool_input_schema=input_schema)
        server.middleware = [self._middleware]
        return server

    async def _middleware(
        self,
        ctx: ServerRequestContext[Any, Any],
        call_next: Callable[[ServerRequestContext[Any, Any]], Awaitable[Any]],
    ) -> Any:
        principal = principal_of(ctx)
        connector_id = _connector_id(principal.route)
        if ctx.request_id is None:  # a client notification
            relayed = _connection_state(ctx).get(_STATE_KEY)
            if isinstance(relayed, RelayedConnection) and ctx.method not in _NOT_RELAYED:
                await relayed.notify(ctx.method, ctx.params)
            return await call_next(ctx)  # the downstream connection keeps its own state too
        session = self._sessions.alive(principal.session_id)
        if session is None:
            raise MCPError(code=INVALID_REQUEST, message="this session has ended")
        connector = self._trusted(connector_id)
        if not reaches_connector(session, connector.id, needs_network=connector.spec.network):
            # SECURITY: nothing of it is this session's to use, so no process of it starts for this session.
            raise MCPError(code=INVALID_REQUEST, message=f"this session may not use connector {connector.id}")
        if ctx.method == "initialize":
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return await call_next(ctx)  # removed at 2026-07-28: the SDK answers as its own server would
            return await self._initialize(ctx, session, connector)
        relayed = await self._relayed_connection(ctx, session, connector)
        channel, _ = _channels(ctx)
        with relayed.serving(channel):
            return await self._forward(_Exchange(ctx, session, connector, relayed, channel))

    def _trusted(self, connector_id: str) -> Connector:
        try:
            connector = self._manager.get(connector_id)
        except SidecarError:
            connector = None
        if connector is None or not connector.trusted:
            raise MCPError(code=INVALID_REQUEST, message=f"connector {connector_id} is not trusted")
        return connector

    # -- connections -------------------------------------------------------------------------------

    async def _initialize(
        self, ctx: ServerRequestContext[Any, Any], session: Session, connector: Connector
    ) -> dict[str, Any]:
        """A 2025-era MCP session opens: give it a connector connection of its own and relay the handshake."""
        _, connection = _channels(ctx)
        try:
            relayed = await self._relayed.open(session.id, session.workspace, connector.spec)
        except ToolError as exc:
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
        relayed.standalone = connection
        connection.state[_STATE_KEY] = relayed
        # The SDK unwinds this stack when the MCP session ends (DELETE, idle expiry, shutdown).
        connection.exit_stack.push_async_callback(self._relayed.drop, relayed)
        try:
            return await relayed.request("initialize", ctx.params, {"cancel_on_abandon": False}, within=START_TIMEOUT)
        except BaseException:
            await self._relayed.drop(relayed)
            raise

    async def _relayed_connection(
        self, ctx: ServerRequestContext[Any, Any], session: Session, connector: Connector
    ) -> RelayedConnection:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            try:
                return await self._relayed.shared(session.id, session.workspace, connector.spec)
            except ToolError as exc:
                raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
        relayed = _connection_state(ctx).get(_STATE_KEY)
        if not isinstance(relayed, RelayedConnection) or not relayed.alive:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=f"connector {connector.id} is not running for this MCP session; start a new session",
            )
        return relayed

    # -- forwarding --------------------------------------------------------------------------------

    async def _forward(self, exchange: _Exchange) -> dict[str, Any]:
        ctx, session, connector, relayed, channel = exchange
        method, params = ctx.method, ctx.params
        opts = _call_options(ctx)
        if method == "tools/call":
            return await self._call_tool(exchange, opts)
        if method not in _UNGATED and not grants_connector(session, connector.id, needs_network=connector.spec.network):
            raise MCPError(code=INVALID_REQUEST, message=f"this session's grant does not include {connector.id}")
        result = await relayed.request(method, params, opts, origin=_origin(ctx, channel))
        if method == "tools/list":
            result = self._visible_tools(session, connector, result)
        return result

    def _visible_tools(self, session: Session, connector: Connector, result: dict[str, Any]) -> dict[str, Any]:
        listed = [tool for tool in result.get("tools") or [] if isinstance(tool, Mapping)]
        self._connector_tools.record_drift(connector, listed)
        kept = [
            tool
            for tool in listed
            if tool.get("name") not in connector.tool_drift
            and self._tools.lookup(session, connector_tool(connector.id, str(tool.get("name")))) is not None
        ]
        return {**result, "tools": kept}

    async def _call_tool(self, exchange: _Exchange, opts: CallOptions) -> dict[str, Any]:
        ctx, session, connector, relayed, channel = exchange
        params = dict(ctx.params or {})
        name = params.get("name")
        if not isinstance(name, str):
            raise MCPError(code=INVALID_PARAMS, message="tools/call needs a tool name")
        if name in connector.tool_drift:
            return _error_result(ctx, withheld_message(connector, name))
        failure: list[MCPError] = []

        async def execute(arguments: dict[str, Any], context: CallContext) -> ToolOutput:
            # Only the arguments the tool declares go on (as on /mcp); everything else of the request
            # (its _meta, 2026-07-28 input responses and request state) passes as it came.
            forwarded = {**params, "arguments": arguments}
            try:
                raw = await relayed.request("tools/call", forwarded, opts, origin=_origin(ctx, channel))
            except MCPError as exc:
                failure.append(exc)
                raise ToolError(exc.error.message) from None
            return ToolOutput(text=_preview(raw), is_error=bool(raw.get("isError")), raw=raw)

        outcome = await self._tools.call(
            session,
            connector_tool(connector.id, name),
            params.get("arguments") if isinstance(params.get("arguments"), Mapping) else {},
            via="relay",
            abort_keys=(route_key(principal_of(ctx).route),),
            ask=elicitation_asker(ctx),
            execute=execute,
        )
        if failure:
            raise failure[0]  # the connector's own JSON-RPC error, as it sent it
        if outcome.raw is not None:
            return dict(outcome.raw)
        return _error_result(ctx, outcome.text)


class _Exchange(NamedTuple):
    """One request the relay forwards: its context, whose it is, to which connection, back on which channel."""

    ctx: ServerRequestContext[Any, Any]
    session: Session
    connector: Connector
    relayed: RelayedConnection
    channel: Sink


def _origin(ctx: ServerRequestContext[Any, Any], channel: Sink) -> tuple[Sink, RequestId] | None:
    return (channel, ctx.request_id) if ctx.request_id is not None else None


def _connector_id(route: str) -> str:
    return connector_of_route(route) or ""


def _channels(ctx: ServerRequestContext[Any, Any]) -> tuple[Sink, Connection]:
    """The exchange's raw request-scoped channel and the MCP connection behind ``ctx.session``."""
    channel, connection = request_channels(ctx)
    return cast(Sink, channel), connection


def _connection_state(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
    return _channels(ctx)[1].state


def _call_options(ctx: ServerRequestContext[Any, Any]) -> CallOptions:
    """How one request goes on: its routing headers (2026-07-28) and, if asked for, its progress."""
    opts: CallOptions = {}
    headers = _routing_headers(ctx)
    if headers:
        opts["headers"] = headers
    meta = (ctx.params or {}).get("_meta")
    if isinstance(meta, Mapping) and meta.get("progressToken") is not None:
        request_outbound: Any = _channels(ctx)[0]

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            await request_outbound.progress(progress, total, message)  # under the client's own token

        opts["on_progress"] = progress
    return opts


def _routing_headers(ctx: ServerRequestContext[Any, Any]) -> dict[str, str]:
    """A 2026-07-28 request's MCP headers, for an HTTP connector (stdio ignores them).

    At 2026-07-28 the server routes on ``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name`` and
    ``Mcp-Param-*`` (the SDK checked them against the body before we saw it); without them an HTTP
    connector would take the request for a 2025-era one.
    """
    request = ctx.request
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or request is None:
        return {}
    return {
        name: value
        for name, value in request.headers.items()
        if name in _ROUTING_HEADERS or name.startswith(_PARAM_PREFIX)
    }


def _preview(raw: Mapping[str, Any]) -> str:
    """A text summary of a relayed result, for the audit preview (the client gets the result whole)."""
    content = raw.get("content")
    if isinstance(content, list):
        texts = [str(block.get("text", "")) for block in content if isinstance(block, Mapping)]
        return "\n".join(t for t in texts if t) or f"[{len(content)} blocks]"
    return str(raw.get("resultType") or "result")


def _error_result(ctx: ServerRequestContext[Any, Any], text: str) -> dict[str, Any]:
    """Sidecar's own tool error (refused, unknown, awaiting approval, withheld) in the client's era.

    The relay's middleware answers without ``call_next``, so the SDK does not shape its results: this
    does what the SDK does for a handler's result, so that a 2026-07-28 result carries the
    ``resultType`` that era requires and a 2025-era one carries nothing its schema lacks.
    """
    result = types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return serialize_server_result("tools/call", ctx.protocol_version, dumped)
