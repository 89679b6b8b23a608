"""The MCP server behind ``/mcp``: tool handlers over the ``ToolService``, and list_changed delivery.

This and ``edge/endpoint.py`` are the only modules that touch the SDK's server side. Handlers find the
caller in the ASGI scope (put there by the bridge after auth) and re-read the live session on every
request, so an ended session or a shrunken grant applies immediately.

``tools/list_changed`` reaches a session's clients two ways: 2025-era clients through their MCP
transport session's standalone (GET) stream, 2026-07-28 clients through ``subscriptions/listen``
streams fed by a per-session subscription bus.

An agent is told what it may search for (``deferred_hint``): the server's ``instructions`` (``initialize``,
``server/discover``) and the ``tool_search`` description in ``tools/list`` name the connectors and the
deferred tools of *this* session, nothing it may not use.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, Final, Protocol

from mcp import types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from sidecar import __version__
from sidecar.auth.principal import SCOPE_KEY, Principal
from sidecar.auth.routes import route_key
from sidecar.auth.sessions import Session, SessionStore
from sidecar.bus.asking import Answer, Asker, Question
from sidecar.bus.registry import Risk, ToolDef
from sidecar.bus.tools import NOT_AVAILABLE, ToolService
from sidecar.connectors.catalog import local_uri
from sidecar.errors import NotFound, ToolError
from sidecar.names import PROXY_ROUTE, connector_of_route, connector_tool

__all__ = ["CALLER", "ChangeHub", "build_mcp_server", "elicitation_asker", "principal_of", "tool_control_id"]

logger = logging.getLogger(__name__)

MAX_LEGACY_PER_SESSION: Final = 64
"""MCP transport sessions remembered per sidecar session for list_changed (oldest dropped first)."""

META_PREFIX: Final = "dev.sidecar/"
INSTRUCTIONS: Final = "sidecar: the tools this agent session may use on this machine."
HINT_TOOLS: Final = 60
"""Deferred tools the hint names one by one; past that it names their connectors and counts the rest."""
HINT_DESCRIPTION: Final = 80
"""Characters of each deferred tool's description in the hint."""
RESOURCE_NOT_FOUND: Final = -32002
"""MCP's error code for an unknown resource."""


def tool_control_id(tool: ToolDef) -> str:
    """A stable id for host UIs: the same tool from the same source always gets the same id."""
    digest = hashlib.sha256(f"{tool.source}\x00{tool.server}\x00{tool.name}".encode()).hexdigest()
    return f"tc_{digest[:20]}"


CALLER: ContextVar[Principal | None] = ContextVar("sidecar_mcp_caller", default=None)
"""The caller of the request being handled, set by the endpoint for the SDK callbacks that get no ctx."""


def principal_of(ctx: ServerRequestContext[Any, Any]) -> Principal:
    request = ctx.request
    scope = getattr(request, "scope", None)
    principal = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    if not isinstance(principal, Principal):
        # Only reachable if the bridge was bypassed; refuse rather than guess.
        raise PermissionError("request reached the MCP server without a verified principal")
    return principal


class Catalog(Protocol):
    """Resources and prompts from connectors (``connectors/catalog.py``), per session."""

    def resources(self, session: Session) -> list[types.Resource]: ...

    def templates(self, session: Session) -> list[types.ResourceTemplate]: ...

    def prompts(self, session: Session) -> list[types.Prompt]: ...

    async def read(self, session: Session, uri: str) -> types.ReadResourceResult: ...

    async def prompt(self, session: Session, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult: ...


class ChangeHub:
    """Knows each sidecar session's MCP clients, to tell them when its visible tools change."""

    def __init__(self) -> None:
        self._legacy: dict[str, OrderedDict[str, ServerSession]] = {}
        self._listeners: dict[str, tuple[InMemorySubscriptionBus, ListenHandler]] = {}
        self._tasks: set[asyncio.Task[int]] = set()

    def announce(self, session_ids: Iterable[str]) -> None:
        """``tools_changed`` for each session, in the background: callers are synchronous event handlers."""
        loop = asyncio.get_running_loop()
        for session_id in session_ids:
            task = loop.create_task(self.tools_changed(session_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def remember(self, session_id: str, transport_session_id: str, session: ServerSession) -> None:
        known = self._legacy.setdefault(session_id, OrderedDict())
        if transport_session_id in known:
            known.move_to_end(transport_session_id)
            return
        known[transport_session_id] = session
        while len(known) > MAX_LEGACY_PER_SESSION:
            known.popitem(last=False)

    def clients(self, session_id: str) -> int:
        """How many MCP clients of ``session_id`` are known: 2025-era transport sessions, plus one for a
        2026-07-28 client listening for changes (the console shows it; a client that went away without
        a DELETE is counted until a notification to it fails)."""
        return len(self._legacy.get(session_id, ())) + (1 if session_id in self._listeners else 0)

    def forget_transport(self, session_id: str, transport_session_id: str) -> None:
        known = self._legacy.get(session_id)
        if known is not None:
            known.pop(transport_session_id, None)

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        session_id = principal_of(ctx).session_id
        entry = self._listeners.get(session_id)
        if entry is None:
            bus = InMemorySubscriptionBus()
            entry = self._listeners[session_id] = (bus, ListenHandler(bus, max_subscriptions=64))
        return await entry[1](ctx, params)

    async def tools_changed(self, session_id: str) -> int:
        """Notify every known client of ``session_id``; return how many deliveries were attempted."""
        sent = 0
        for transport_id, session in list(self._legacy.get(session_id, {}).items()):
            try:
                await session.send_tool_list_changed()
                sent += 1
            except Exception as exc:  # a closed transport: forget it
                logger.debug("dropping MCP session %s of %s: %s", transport_id[:12], session_id, exc)
                self.forget_transport(session_id, transport_id)
        entry = self._listeners.get(session_id)
        if entry is not None:
            await entry[0].publish(ToolsListChanged())
            sent += 1
        return sent

    def forget(self, session_id: str) -> None:
        self._legacy.pop(session_id, None)
        entry = self._listeners.pop(session_id, None)
        if entry is not None:
            entry[1].close()


class _SidecarServer(Server[Any]):
    """The lowlevel server, advertising ``tools.listChanged`` (the manager passes no options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


def _tool_to_mcp(tool: ToolDef) -> types.Tool:
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=dict(tool.input_schema),
        annotations=types.ToolAnnotations(
            title=tool.title,
            read_only_hint=tool.risk is Risk.LOW,
            destructive_hint=tool.risk is not Risk.LOW,
            open_world_hint=tool.needs_network,
        ),
        _meta={
            META_PREFIX + "risk": tool.risk.value,
            META_PREFIX + "toolControlId": tool_control_id(tool),
            META_PREFIX + "requiresConfirmation": tool.risk is Risk.MEDIUM,
        },
    )


def deferred_hint(deferred: list[ToolDef]) -> str:
    """What a session may search for: its connectors with deferred tools, and those tools with a short
    description (the first ``HINT_TOOLS``); empty when nothing is deferred. Built from the session's own
    deferred tools only, so it names nothing the session may not use."""
    if not deferred:
        return ""
    by_server: dict[str, int] = {}
    for tool in deferred:
        by_server[tool.server] = by_server.get(tool.server, 0) + 1
    servers = ", ".join(
        f"{server} ({count} tool{'s' if count != 1 else ''})" for server, count in sorted(by_server.items())
    )
    lines = [
        "Deferred tools are not in the tool list: find one with tool_search (what it does, or its name), "
        "then run it with tool_call.",
        f"Connectors and sources you may search: {servers}.",
        "Deferred tools:",
    ]
    for tool in deferred[:HINT_TOOLS]:
        description = " ".join(tool.description.split())
        if len(description) > HINT_DESCRIPTION:
            description = description[: HINT_DESCRIPTION - 1] + "…"
        lines.append(f"- {tool.name}: {description}" if description else f"- {tool.name}")
    if len(deferred) > HINT_TOOLS:
        lines.append(f"- and {len(deferred) - HINT_TOOLS} more: tool_search finds them.")
    return "\n".join(lines)


def _with_hint(text: str, hint: str) -> str:
    return f"{text}\n\n{hint}" if hint else text


def build_mcp_server(
    *, tools: ToolService, sessions: SessionStore, hub: ChangeHub, catalog: Catalog | None = None
) -> Server[Any]:
    """The SDK server for ``/mcp``. Every handler resolves the live session first."""

    def live_session(ctx: ServerRequestContext[Any, Any]) -> Session | None:
        return sessions.alive(principal_of(ctx).session_id)

    converted: dict[str, tuple[ToolDef, types.Tool]] = {}

    def as_mcp(tool: ToolDef) -> types.Tool:
        # ToolDef is frozen, so its MCP form only changes when the definition does: convert once.
        cached = converted.get(tool.name)
        if cached is None or cached[0] is not tool:
            cached = converted[tool.name] = (tool, _tool_to_mcp(tool))
        return cached[1]

    async def on_list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        session = live_session(ctx)
        if session is None:
            return types.ListToolsResult(tools=[])
        route = principal_of(ctx).route
        if route == PROXY_ROUTE:
            listed, deferred = tools.partition(session)
            hint = deferred_hint(deferred)
            return types.ListToolsResult(tools=[_hinted(as_mcp(t), hint) for t in listed])
        # A connector's own route (/mcp/connectors/<id>): that connector's tools only, none deferred.
        return types.ListToolsResult(tools=[as_mcp(t) for t in tools.visible(session) if t.source == route])

    async def on_call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        """The result as a dict, not a model: the SDK validates and shapes it for the client's era once,
        on its way out (a model here would be built, dumped and validated again)."""
        principal = principal_of(ctx)
        session = sessions.alive(principal.session_id)
        if session is None:
            return _error_result("this session has ended")
        if principal.route != PROXY_ROUTE:
            tool = tools.lookup(session, params.name)
            if tool is None or tool.source != principal.route:
                return _error_result(NOT_AVAILABLE)  # SECURITY: a connector's route reaches that connector only
        outcome = await tools.call(
            session,
            params.name,
            params.arguments,
            via="mcp",
            abort_keys=(route_key(principal.route),),
            ask=elicitation_asker(ctx),
            # None unless the request carried a progress token: then a connector call can skip its relay.
            progress=ctx.session.report_progress if _wants_progress(ctx) else None,
        )
        # A connector's blocks (images, resources, …) pass through as they came.
        content = list(outcome.content) if outcome.content is not None else [{"type": "text", "text": outcome.text}]
        result: dict[str, Any] = {"resultType": "complete", "content": content, "isError": outcome.is_error}
        if outcome.structured is not None:
            result["structuredContent"] = dict(outcome.structured)
        if outcome.meta is not None:
            result["_meta"] = dict(outcome.meta)
        return result

    async def instruct(
        ctx: ServerRequestContext[Any, Any], call_next: Callable[[ServerRequestContext[Any, Any]], Awaitable[Any]]
    ) -> Any:
        """The session's own ``instructions``: what it may search for (``initialize``, ``server/discover``)."""
        result = await call_next(ctx)
        if ctx.method not in _INSTRUCTED or not isinstance(result, dict):
            return result
        principal = principal_of(ctx)
        session = sessions.alive(principal.session_id)
        if principal.route != PROXY_ROUTE or session is None:
            return result
        return {**result, "instructions": _with_hint(INSTRUCTIONS, deferred_hint(tools.partition(session)[1]))}

    async def remember_clients(
        ctx: ServerRequestContext[Any, Any], call_next: Callable[[ServerRequestContext[Any, Any]], Awaitable[Any]]
    ) -> Any:
        request = ctx.request
        if request is not None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            transport_id = request.headers.get("mcp-session-id")
            if transport_id:
                hub.remember(principal_of(ctx).session_id, transport_id, ctx.session)
        return await call_next(ctx)

    def input_schema(name: str) -> dict[str, Any] | None:
        # The SDK checks 2026-07-28 Mcp-Param-* headers against the called tool's schema; without this
        # it would run a whole tools/list per call. Only a tool this caller may see has a schema.
        principal = CALLER.get()
        session = sessions.alive(principal.session_id) if principal is not None else None
        tool = tools.lookup(session, name) if session is not None else None
        return dict(tool.input_schema) if tool is not None else None

    catalog_handlers = _catalog_handlers(catalog, live_session)

    server = _SidecarServer(
        "sidecar",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
        on_subscriptions_listen=hub.listen,
        get_tool_input_schema=input_schema,
        **catalog_handlers,
    )
    # Not the SDK's default OpenTelemetry middleware: it costs time on every call and exports nothing here.
    server.middleware = [remember_clients, instruct]
    return server


_INSTRUCTED: Final = frozenset({"initialize", "server/discover"})


def _hinted(tool: types.Tool, hint: str) -> types.Tool:
    """``tool_search`` as this session sees it: its description names what the session may search for."""
    if tool.name != "tool_search" or not hint:
        return tool
    return tool.model_copy(update={"description": _with_hint(tool.description or "", hint)})


def _catalog_handlers(
    catalog: Catalog | None, live_session: Callable[[ServerRequestContext[Any, Any]], Session | None]
) -> dict[str, Any]:
    """Resources and prompts of the session's connectors: namespaced, routed to its own processes."""

    def live(ctx: ServerRequestContext[Any, Any]) -> Session:
        session = live_session(ctx)
        if session is None:
            raise MCPError(code=types.INVALID_REQUEST, message="this session has ended")
        return session

    def scope(ctx: ServerRequestContext[Any, Any]) -> tuple[str, str] | None:
        """On a connector's own route: the (URI, name) prefixes it may reach; None on the bus."""
        connector_id = connector_of_route(principal_of(ctx).route)
        if connector_id is None:
            return None
        return local_uri(connector_id, ""), connector_tool(connector_id, "")

    def in_scope(ctx: ServerRequestContext[Any, Any], value: str, which: int) -> bool:
        prefixes = scope(ctx)
        return prefixes is None or value.startswith(prefixes[which])

    async def on_list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        found = catalog.resources(live(ctx)) if catalog else []
        return types.ListResourcesResult(resources=[r for r in found if in_scope(ctx, str(r.uri), 0)])

    async def on_list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        found = catalog.templates(live(ctx)) if catalog else []
        return types.ListResourceTemplatesResult(
            resource_templates=[t for t in found if in_scope(ctx, t.uri_template, 0)]
        )

    async def on_read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if catalog is None or not in_scope(ctx, str(params.uri), 0):
            raise MCPError(code=RESOURCE_NOT_FOUND, message="resource not found")
        try:
            return await catalog.read(live(ctx), str(params.uri))
        except NotFound:
            raise MCPError(code=RESOURCE_NOT_FOUND, message="resource not found") from None
        except ToolError as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None

    async def on_list_prompts(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        found = catalog.prompts(live(ctx)) if catalog else []
        return types.ListPromptsResult(prompts=[p for p in found if in_scope(ctx, p.name, 1)])

    async def on_get_prompt(
        ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if catalog is None or not in_scope(ctx, params.name, 1):
            raise MCPError(code=types.INVALID_PARAMS, message="prompt not found")
        try:
            return await catalog.prompt(live(ctx), params.name, params.arguments)
        except NotFound:
            raise MCPError(code=types.INVALID_PARAMS, message="prompt not found") from None
        except ToolError as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None

    return {
        "on_list_resources": on_list_resources,
        "on_list_resource_templates": on_list_resource_templates,
        "on_read_resource": on_read_resource,
        "on_list_prompts": on_list_prompts,
        "on_get_prompt": on_get_prompt,
    }


def elicitation_asker(ctx: ServerRequestContext[Any, Any]) -> Asker | None:
    """Ask through MCP elicitation when this client and this exchange can carry the question."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None  # 2026-07-28 has no server-to-client requests: pending approval instead
    session = ctx.session
    capabilities = session.client_capabilities
    if capabilities is None or capabilities.elicitation is None or not session.can_send_request:
        return None

    async def ask(question: Question) -> Answer:
        properties: dict[str, Any] = {}
        if question.rememberable:
            properties["remember"] = {
                "type": "boolean",
                "title": "Allow for the rest of this session",
                "default": False,
            }
        result = await session.elicit_form(
            question.message,
            {"type": "object", "properties": properties},
            related_request_id=ctx.request_id,
        )
        if result.action == "accept":
            remember = bool((result.content or {}).get("remember")) and question.rememberable
            return Answer.ACCEPT_REMEMBER if remember else Answer.ACCEPT
        return Answer.DECLINE if result.action == "decline" else Answer.CANCEL

    return ask


def _error_result(message: str) -> dict[str, Any]:
    # ``resultType`` is required at 2026-07-28; the SDK's shaping drops it for a 2025-era client.
    return {"resultType": "complete", "content": [{"type": "text", "text": message}], "isError": True}


def _wants_progress(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the request carried a progress token (``_meta.progressToken``)."""
    meta = (ctx.params or {}).get("_meta")
    return isinstance(meta, Mapping) and meta.get("progressToken") is not None
