"""Composition root: ``build_app(settings, paths, runtime)`` wires every part in one readable place.

Middleware order (outermost first): error rendering → network guard (SPEC §3, before anything else)
→ authentication (SPEC §4) → handlers. Long-lived resources are ``cleanup_ctx`` entries in dependency
order; teardown runs in reverse: routes are revoked first (aborting in-flight requests and streams),
then the MCP session manager stops, then the audit log closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from aiohttp import web

from sidecar.appkeys import (
    APPROVALS,
    AUDIT,
    BILLING,
    CONNECTORS,
    HUB,
    INFLIGHT,
    PATHS,
    REGISTRY,
    ROUTES,
    RUNTIME,
    SESSIONS,
    SETTINGS,
    TOOLS,
    Runtime,
)
from sidecar.auth.encoding import mint_token
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.middleware import PRINCIPAL, make_auth_middleware
from sidecar.auth.routes import PROXY_ROUTE, RouteRegistry
from sidecar.auth.sessions import Session, SessionStore
from sidecar.bus.approvals import Approval, ApprovalStore
from sidecar.bus.billing import BillingGate, ManifestSource
from sidecar.bus.builtins import install_builtins
from sidecar.bus.endpoint import McpEndpoint
from sidecar.bus.mcp import ChangeHub, build_mcp_server
from sidecar.bus.registry import ToolRegistry
from sidecar.bus.rest import RestFacade
from sidecar.bus.tools import DeferPolicy, ToolService
from sidecar.config import Settings
from sidecar.connectors.manager import ConnectorManager
from sidecar.connectors.pool import LaunchContext, PoolLimits
from sidecar.connectors.relay import Relay
from sidecar.connectors.service import ConnectorService
from sidecar.control import add_control_routes
from sidecar.http import error_middleware, json_response
from sidecar.net.guard import add_vary_origin, make_guard_middleware
from sidecar.paths import Paths
from sidecar.store.audit import AuditLog
from sidecar.store.trust import TrustStore

__all__ = ["build_app"]

logger = logging.getLogger(__name__)

REPO: Final = Path(__file__).resolve().parents[1]
"""The checkout the daemon runs from (scripts/run): its config/ and connectors/ ship with the code."""
SHIPPED_BILLING: Final = REPO / "config" / "high-credit-tools.json"
SHIPPED_CONNECTORS: Final = REPO / "connectors"


def build_app(
    settings: Settings,
    paths: Paths,
    runtime: Runtime,
    *,
    registry: ToolRegistry | None = None,
) -> web.Application:
    """The daemon's aiohttp application. ``registry`` lets benchmarks and tests add tools."""
    inflight = InflightTracker()
    audit = AuditLog(paths.audit_file)
    routes = RouteRegistry(inflight, on_event=lambda name, event: _audit_route(audit, name, event))
    sessions = SessionStore(inflight, default_ttl=settings.sessions.default_ttl, max_ttl=settings.sessions.max_ttl)
    trust = TrustStore(
        paths.state / "approvals.json", on_event=lambda event, fields: _audit_event(audit, event, fields)
    )
    connectors = ConnectorManager(
        package_dirs=[SHIPPED_CONNECTORS, paths.data / "connectors"],
        user_config=paths.config / "mcp.json",
        plugins_dir=paths.data / "plugins",
        install_dir=paths.data / "connectors",
        trust=trust,
    )
    connectors.refresh()
    registry = install_builtins(
        registry or ToolRegistry(),
        notes_dir=paths.data / "notes",
        connectors=lambda session_id: [c.public() for c in connectors.trusted()],
    )
    hub = ChangeHub()

    def launch_context(session_id: str, workspace: str) -> LaunchContext:
        return LaunchContext(
            origin=f"http://127.0.0.1:{runtime.port}",
            # The internal API (SPEC §7) that this credential is for arrives with OAuth; until then it
            # authorizes nothing, and a connector never sees a route token or the user's tokens.
            authorization=f"Bearer {mint_token()}",
            envelope=sessions.envelope(session_id),
            workspace=workspace,
        )

    announcer = _Announcer(hub, sessions)
    connector_service = ConnectorService(
        manager=connectors,
        trust=trust,
        registry=registry,
        cache_dir=paths.state / "connectors",
        context=launch_context,
        notify=announcer,
        routes=routes,
        limits=PoolLimits(
            per_connector=settings.connectors.max_per_connector,
            total=settings.connectors.max_total,
            idle_seconds=settings.connectors.idle_seconds,
            start_timeout=settings.connectors.start_timeout,
        ),
    )
    approvals = ApprovalStore()
    billing = BillingGate(billing_sources(settings, paths))
    tools = ToolService(
        registry,
        sessions=sessions,
        audit=audit,
        inflight=inflight,
        approvals=approvals,
        billing=billing,
        defer=DeferPolicy(
            tools=frozenset(settings.tools.defer),
            sources=frozenset(settings.tools.defer_sources),
            auto_above=settings.tools.auto_defer_above,
        ),
    )
    endpoint = McpEndpoint(
        build_mcp_server(tools=tools, sessions=sessions, hub=hub, catalog=connector_service.catalog),
        settings=settings,
        inflight=inflight,
        hub=hub,
    )
    relay = Relay(
        manager=connectors,
        connector_tools=connector_service.tools,
        tools=tools,
        sessions=sessions,
        context=launch_context,
        start_timeout=settings.connectors.start_timeout,
        check_caps=connector_service.pool.check_caps,
    )
    connector_service.relay = relay
    relay_endpoint = McpEndpoint(relay.server(), settings=settings, inflight=inflight, hub=hub)

    app = web.Application(
        middlewares=[
            error_middleware,
            make_guard_middleware(
                port=lambda: runtime.port,
                allowed_origins=settings.origin_tuples(),
                fetch_site_exempt=lambda path: False,
            ),
            make_auth_middleware(routes=routes, sessions=sessions, control_digest=lambda: runtime.control_digest),
        ],
        client_max_size=settings.limits.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[PATHS] = paths
    app[RUNTIME] = runtime
    app[AUDIT] = audit
    app[INFLIGHT] = inflight
    app[ROUTES] = routes
    app[SESSIONS] = sessions
    app[REGISTRY] = registry
    app[TOOLS] = tools
    app[HUB] = hub
    app[APPROVALS] = approvals
    app[BILLING] = billing
    app[CONNECTORS] = connector_service

    sessions.subscribe(_SessionEvents(audit, hub, approvals, connector_service, announcer))
    approvals.subscribe(lambda approval, event: _audit_approval(audit, approval, event))

    async def mcp(request: web.Request) -> web.StreamResponse:
        return await endpoint.handle(request, request[PRINCIPAL])

    async def relayed(request: web.Request) -> web.StreamResponse:
        return await relay_endpoint.handle(request, request[PRINCIPAL])

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    app.on_response_prepare.append(add_vary_origin)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/mcp", mcp)
    app.router.add_route("*", "/mcp/connectors/{connector_id}", relayed)
    RestFacade(registry=registry, tools=tools, sessions=sessions, limits=settings.limits).add_routes(app)
    add_control_routes(app)

    _add_lifecycle(
        app,
        audit=audit,
        endpoints=(endpoint, relay_endpoint),
        routes=routes,
        sessions=sessions,
        runtime=runtime,
        connectors=connector_service,
    )

    async def connectors_ctx(app: web.Application) -> AsyncIterator[None]:
        yield
        await connector_service.close()  # every connector process, bounded by each one's stop escalation

    app.cleanup_ctx.append(connectors_ctx)
    return app


def _add_lifecycle(
    app: web.Application,
    *,
    audit: AuditLog,
    endpoints: tuple[McpEndpoint, ...],
    routes: RouteRegistry,
    sessions: SessionStore,
    runtime: Runtime,
    connectors: ConnectorService,
) -> None:
    """Start-up and teardown, in dependency order (teardown runs in reverse)."""

    async def audit_ctx(app: web.Application) -> AsyncIterator[None]:
        audit.append("daemon.start", pid=runtime.pid)
        yield
        audit.append("daemon.stop", pid=runtime.pid)
        audit.close()

    async def manager_ctx(app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for endpoint in endpoints:
                await stack.enter_async_context(endpoint.run())
            yield

    async def routes_ctx(app: web.Application) -> AsyncIterator[None]:
        routes.register(PROXY_ROUTE, path="/mcp")
        connectors.start()  # cached tools of connectors trusted earlier, and their own routes
        yield
        await revoke_all(app)

    async def revoke_all(app: web.Application) -> None:
        # Stopping revokes every token: sessions end, then routes go, each aborting what runs on it.
        # Runs on shutdown, before aiohttp waits for open handlers, so streams do not hold the stop.
        sessions.end_all()
        for route in routes.list():
            routes.unregister(route.name)

    app.cleanup_ctx.extend([audit_ctx, manager_ctx, routes_ctx])
    app.on_shutdown.append(revoke_all)


def billing_sources(settings: Settings, paths: Paths) -> list[ManifestSource]:
    """The built-in tools' manifests: the shipped one (required) and the user's own (optional)."""
    shipped = Path(settings.tools.billing_manifest) if settings.tools.billing_manifest else SHIPPED_BILLING
    return [
        ManifestSource(scope="builtin", path=shipped, required=True),
        ManifestSource(scope="builtin", path=paths.config / "high-credit-tools.json", required=False),
    ]


def _audit_route(audit: AuditLog, name: str, event: str) -> None:
    kind = {"registered": "token.mint", "rotated": "token.mint", "unregistered": "token.revoke"}[event]
    audit.append(kind, route=name, reason=event)


def _audit_event(audit: AuditLog, event: str, fields: dict[str, object]) -> None:
    audit.append(event, **fields)


def _audit_approval(audit: AuditLog, approval: Approval, event: str) -> None:
    audit.append(f"approval.{event}", **_approval_fields(approval))


def _approval_fields(approval: Approval) -> dict[str, object]:
    return {
        "approval": approval.id,
        "session": approval.session_id,
        "tool": approval.tool,
        "kind": approval.kind,
        "group": approval.group,
        "args_digest": approval.digest,
    }


class _Announcer:
    """``tools/list_changed`` to one session's clients, or to every session's (connector changes)."""

    def __init__(self, hub: ChangeHub, sessions: SessionStore) -> None:
        self._hub = hub
        self._sessions = sessions
        self._tasks: set[asyncio.Task[int]] = set()

    def __call__(self, session_id: str | None) -> None:
        targets = [session_id] if session_id is not None else [s.id for s in self._sessions.list()]
        loop = asyncio.get_running_loop()
        for target in targets:
            task = loop.create_task(self._hub.tools_changed(target))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


class _SessionEvents:
    """Audit session lifecycle and push ``tools/list_changed`` when a session's grant changes."""

    def __init__(
        self,
        audit: AuditLog,
        hub: ChangeHub,
        approvals: ApprovalStore,
        connectors: ConnectorService,
        announce: _Announcer,
    ) -> None:
        self._audit = audit
        self._hub = hub
        self._approvals = approvals
        self._connectors = connectors
        self._announce = announce

    def __call__(self, session: Session, event: str) -> None:
        self._audit.append(
            f"session.{event}",
            session=session.id,
            project=session.project_id,
            mode=session.mode.value,
            allow=list(session.allow),
            network=session.network,
        )
        if event == "updated":
            self._announce(session.id)
        elif event == "ended":
            self._hub.forget(session.id)
            self._approvals.forget_session(session.id)
            self._connectors.session_ended(session.id)
