"""Composition root: ``build_app(settings, paths, runtime)`` is the list of the daemon's subsystems.

Each subsystem is one ``cleanup_ctx``: it builds its objects from what the earlier ones put in the app
(typed ``AppKey``s from ``appkeys.py``), passing every dependency in, and tears them down after the
later ones. Start-up runs them in order, teardown in reverse:

1. store — the audit log, the trust store (closed last, so teardown is audited) and the credential store
   (its key in the OS keyring, else a key file); then the front door, which refuses connections from
   other OS accounts at accept and audits them in aggregate (``net.frontdoor``);
2. auth — in-flight tracking, route tokens, sessions, and the journal that keeps sessions and the tokens
   handed to them across a restart (``auth.persist``); sessions that end with a process are watched;
3. bus — the tool registry with the built-ins, approvals, the billable gate, the tool service, and the
   hub that tells clients their tools changed;
4. oauth — the OAuth broker: one grant per remote connector, shared by every session, kept in the credential
   store; sign-in out of band. It knows nothing of connectors: it announces sign-ins and revocations;
5. connectors — manifests and trust, sandboxed processes and relayed connections, their tools in the
   pool; it asks the broker for each remote call's auth and subscribes to its events;
6. edge — the MCP SDK servers behind ``/mcp`` and ``/mcp/connectors/<id>``, and the routes' tokens
   (revoked first on the way down, aborting in-flight requests and streams).

Middleware order (outermost first): error rendering → network guard (before anything else) →
authentication → handlers. Handlers find their objects in the app at request time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Final

from aiohttp import web

from sidecar import auditing
from sidecar.appkeys import (
    APPROVALS,
    AUDIT,
    AUDIT_CHAIN,
    BILLING,
    CONNECTORS,
    CONSOLE,
    CREDENTIAL_STORE,
    FRONT_DOOR,
    HUB,
    INFLIGHT,
    INTERNAL_API,
    MCP_ENDPOINT,
    OAUTH,
    PATHS,
    PROCESS_CREDENTIALS,
    REFUSALS,
    REGISTRY,
    RELAY_ENDPOINT,
    REST,
    ROUTES,
    RUNTIME,
    SESSIONS,
    SETTINGS,
    STATE,
    TOOLS,
    TRUST,
    Runtime,
)
from sidecar.auth.console import ConsoleSignIn
from sidecar.auth.encoding import mint_token
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.middleware import PRINCIPAL, make_auth_middleware
from sidecar.auth.owners import watching_owners
from sidecar.auth.persist import StateJournal, keeping_saved
from sidecar.auth.process_credentials import ProcessCredentials
from sidecar.auth.routes import RouteRegistry
from sidecar.auth.sessions import Session, SessionStore
from sidecar.bus.approvals import ApprovalStore
from sidecar.bus.billing import BillingGate, ManifestSource
from sidecar.bus.builtins import install_builtins
from sidecar.bus.deferral import DeferPolicy
from sidecar.bus.registry import ToolRegistry
from sidecar.bus.tools import ToolService
from sidecar.config import Settings
from sidecar.connectors.launch import LaunchContext
from sidecar.connectors.manager import Connector, ConnectorManager
from sidecar.connectors.manifest.watch import ConfigWatcher
from sidecar.connectors.pool import PoolLimits
from sidecar.connectors.proxy import Deferral
from sidecar.connectors.service import ConnectorService
from sidecar.connectors.stdio.sandbox import daemon_sandbox
from sidecar.console import SIGNIN_PATH, add_console_routes, console_url, is_console_path
from sidecar.control import add_control_routes
from sidecar.edge.endpoint import McpEndpoint
from sidecar.edge.internal import INTERNAL_ROUTE, InternalApi
from sidecar.edge.jsonanswer import quiet_call
from sidecar.edge.mcp import ChangeHub, build_mcp_server
from sidecar.edge.relay import Relay
from sidecar.edge.rest import RestFacade, add_rest_routes
from sidecar.errors import NotFound
from sidecar.http import add_security_headers, error_middleware, json_response
from sidecar.names import PROXY_ROUTE, is_mcp_endpoint
from sidecar.net.frontdoor import FrontDoor
from sidecar.net.guard import add_vary_origin, make_guard_middleware
from sidecar.net.peer import PeerOwners
from sidecar.oauth.binding import START_PATH
from sidecar.oauth.broker import CALLBACK_PATH, Broker
from sidecar.oauth.forward import Forwarder
from sidecar.oauth.target import UpstreamRule
from sidecar.paths import Paths
from sidecar.store.audit import AuditLog
from sidecar.store.auditverify import VerifiedChain
from sidecar.store.credentials import CredentialStore, DeferredKey
from sidecar.store.files import ensure_private_dir
from sidecar.store.tally import AuditTally
from sidecar.store.trust import TrustStore

__all__ = ["billing_sources", "build_app"]

logger = logging.getLogger(__name__)


def _shipped(name: str) -> Path:
    """A directory the package ships: the repository's ``config/`` or ``connectors/``, found with
    ``importlib.resources`` as ``sidecar/_shipped/<name>`` (links to them in a checkout, copies of them
    in an installed wheel: pyproject.toml's package data).

    Resolved to the real directory: manifests are read with ``O_NOFOLLOW``, and a checkout's connector
    keeps the path (and so the trust key) it had before it was packaged. Were the package imported from
    a zip, the path would not exist: the billing gate then asks before every call (it fails closed) and
    the shipped connectors are missing, both reported by ``sidecar status``.
    """
    return Path(str(resources.files("sidecar").joinpath("_shipped", name))).resolve()


SHIPPED_BILLING: Final = _shipped("config") / "high-credit-tools.json"
"""The built-in tools' billing manifest (``config/high-credit-tools.json``)."""
SHIPPED_CONNECTORS: Final = _shipped("connectors")
"""The connector packages that come with sidecar (``connectors/``, the workspace connector among them)."""

Subsystem = Callable[[web.Application], AsyncIterator[None]]
_GONE: Final = frozenset({"ended", "closed"})
"""Session events after which nothing of the session may stay in this process (``closed``: the daemon
stops, and the session is kept for the next one)."""


def build_app(
    settings: Settings,
    paths: Paths,
    runtime: Runtime,
    *,
    registry: ToolRegistry | None = None,
) -> web.Application:
    """The daemon's aiohttp application. ``registry`` lets benchmarks and tests add tools."""

    def refused(route: str, reason: str) -> bool:
        return app[REFUSALS].count(route, reason)  # looked up per refusal: the tally is made at start-up

    app = web.Application(
        middlewares=[
            error_middleware,
            make_guard_middleware(
                port=lambda: runtime.port,
                allowed_origins=settings.origin_tuples(),
                # Pages a browser reaches from elsewhere: back from the AS, or from the private redirect file
                # (sidecar ui, connectors connect). None holds a secret; what each does needs one the request carries.
                fetch_site_exempt=lambda path: path in (CALLBACK_PATH, START_PATH, SIGNIN_PATH),
                # The console's page calls the daemon (issue 14); an MCP client in a page the daemon
                # serves is no foreign site either (issue 23): its route token is still required.
                own_origin_paths=lambda path: is_console_path(path) or is_mcp_endpoint(path),
                refused=refused,
            ),
            make_auth_middleware(
                routes=lambda: app[ROUTES],
                sessions=lambda: app[SESSIONS],
                control_digest=lambda: runtime.control_digest,
                refused=refused,
            ),
        ],
        client_max_size=settings.limits.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[PATHS] = paths
    app[RUNTIME] = runtime
    app.cleanup_ctx.extend([_store, _front_door, _auth, _bus(registry or ToolRegistry()), _oauth, _connectors, _edge])
    app.on_shutdown.append(_revoke_all)  # before aiohttp waits for open handlers: streams don't hold the stop
    app.on_response_prepare.append(add_vary_origin)
    app.on_response_prepare.append(add_security_headers)
    _add_routes(app)
    return app


async def _store(app: web.Application) -> AsyncIterator[None]:
    paths, runtime = app[PATHS], app[RUNTIME]
    audit = app[AUDIT] = AuditLog(paths.audit_file)
    app[AUDIT_CHAIN] = VerifiedChain(paths.audit_file)
    app[TRUST] = TrustStore(
        paths.state / "approvals.json",
        on_event=lambda event, fields: auditing.any_event(audit, event, fields),
        root=paths.state,
        guarded=(paths.config,),
    )
    ensure_private_dir(paths.data)
    # The key source is chosen when a grant or key is first stored or read (off the event loop, as every
    # store call is): asking the OS keyring costs memory a daemon without sign-ins or sessions never needs.
    key = DeferredKey(f"credentials:{paths.data}", paths.data / "credentials.key")
    app[CREDENTIAL_STORE] = CredentialStore(paths.data / "credentials.enc", key)
    audit.append("daemon.start", pid=runtime.pid)
    yield
    audit.append("daemon.stop", pid=runtime.pid)
    audit.close()


async def _front_door(app: web.Application) -> AsyncIterator[None]:
    door = app[FRONT_DOOR] = FrontDoor(
        owners=PeerOwners(), per_uid=app[SETTINGS].limits.connections_per_uid, audit=app[AUDIT].append
    )
    if not door.checking:
        logger.warning(
            "the peer's OS account is NOT checked: %s; any account on this machine may connect to the daemon's "
            "port (its route tokens are still required)",
            door.describe()["reason"],
        )
    refusals = app[REFUSALS] = AuditTally(app[AUDIT].append, "request.refused", key_name="route")
    with door.watching_accept(asyncio.get_running_loop()):
        yield
    door.close()  # audits refusals still pending, before the audit log closes
    refusals.close()


async def _auth(app: web.Application) -> AsyncIterator[None]:
    settings, paths, audit = app[SETTINGS], app[PATHS], app[AUDIT]
    inflight = app[INFLIGHT] = InflightTracker()
    journal = app[STATE] = StateJournal(paths.state / "sessions.json", app[CREDENTIAL_STORE])
    restored = await asyncio.to_thread(journal.load)
    app[ROUTES] = RouteRegistry(
        inflight,
        on_event=lambda name, event: auditing.route_event(audit, name, event),
        journal=journal,
        carried=restored.tokens,
    )
    sessions = app[SESSIONS] = SessionStore(
        inflight,
        keys=restored.keys,
        key_source=journal.signing_keys,
        journal=journal,
        restored=restored.sessions,
        default_ttl=settings.sessions.default_ttl,
        max_ttl=settings.sessions.max_ttl,
    )
    sessions.subscribe(lambda session, event: auditing.session_event(audit, session, event))
    if restored.sessions or restored.tokens:
        audit.append("session.restored", sessions=[s.id for s in restored.sessions], routes=sorted(restored.tokens))
    # Connector processes' internal-API credentials: a session's die with it, at once.
    credentials = app[PROCESS_CREDENTIALS] = ProcessCredentials(inflight)

    def session_event(session: Session, event: str) -> None:
        if event in _GONE:
            credentials.revoke_session(session.id)

    sessions.subscribe(session_event)
    app[CONSOLE] = ConsoleSignIn()  # the web console's one-time codes and browser sessions
    async with watching_owners(sessions.owned, sessions.end), keeping_saved(journal):
        yield


def _bus(registry: ToolRegistry) -> Subsystem:
    async def bus(app: web.Application) -> AsyncIterator[None]:
        settings, paths, audit, sessions = app[SETTINGS], app[PATHS], app[AUDIT], app[SESSIONS]
        runtime = app[RUNTIME]
        app[REGISTRY] = install_builtins(registry, notes_dir=paths.data / "notes")
        approvals = app[APPROVALS] = ApprovalStore()
        approvals.subscribe(lambda approval, event: auditing.approval_event(audit, approval, event))
        app[BILLING] = BillingGate(billing_sources(settings, paths))
        app[TOOLS] = ToolService(
            registry,
            sessions=sessions,
            audit=audit,
            inflight=app[INFLIGHT],
            approvals=approvals,
            billing=app[BILLING],
            defer=DeferPolicy(
                tools=frozenset(settings.tools.defer),
                sources=frozenset(settings.tools.defer_sources),
                auto_above=settings.tools.auto_defer_above,
            ),
            max_result_chars=settings.tools.max_result_chars,
            mark_connector_output=settings.tools.mark_connector_output,
            console_url=lambda: console_url(runtime.port),
        )
        hub = app[HUB] = ChangeHub()
        sessions.subscribe(lambda session, event: _on_session(hub, approvals, session, event))
        yield

    return bus


async def _oauth(app: web.Application) -> AsyncIterator[None]:
    runtime, audit, credentials = app[RUNTIME], app[AUDIT], app[PROCESS_CREDENTIALS]

    async def revoked(connector_id: str, event: str) -> None:
        if event == "revoked":
            credentials.revoke_connector(connector_id)  # aborts its internal-API calls now

    broker = app[OAUTH] = Broker(
        app[CREDENTIAL_STORE],
        redirect_uri=lambda: f"http://127.0.0.1:{runtime.port}{CALLBACK_PATH}",
        audit=audit.append,
    )
    broker.subscribe(revoked)
    yield
    await broker.close()


async def _connectors(app: web.Application) -> AsyncIterator[None]:
    settings, paths, runtime, sessions, hub = app[SETTINGS], app[PATHS], app[RUNTIME], app[SESSIONS], app[HUB]
    credentials = app[PROCESS_CREDENTIALS]
    sandbox = await daemon_sandbox(settings.connectors.sandbox, paths)

    def launch_context(session_id: str, workspace: str) -> LaunchContext:
        return LaunchContext(
            origin=f"http://127.0.0.1:{runtime.port}",
            # A process gets its own internal-API credential (minted at spawn, revoked at exit); a remote
            # connector has no process and this value authorizes nothing.
            authorization=f"Bearer {mint_token()}",
            envelope=sessions.envelope(session_id),
            workspace=workspace,
            mint=lambda connector_id: credentials.mint(connector_id, session_id),
            sandbox=sandbox,
        )

    def notify(session_id: str | None) -> None:
        hub.announce([session_id] if session_id is not None else [s.id for s in sessions.list()])

    manager = ConnectorManager(
        package_dirs=[SHIPPED_CONNECTORS, paths.data / "connectors"],
        user_config=paths.config / "mcp.json",
        plugins_dir=paths.data / "plugins",
        install_dir=paths.data / "connectors",
        trust=app[TRUST],
    )
    manager.refresh()
    # SECURITY: what is no longer trusted as configured loses its internal-API credentials at once.

    def withdrawn(connector: Connector, event: str) -> None:
        if event in ("untrusted", "changed"):
            credentials.revoke_connector(connector.id)

    manager.subscribe(withdrawn)
    limits = settings.connectors
    service = app[CONNECTORS] = ConnectorService(
        manager=manager,
        trust=app[TRUST],
        registry=app[REGISTRY],
        cache_dir=paths.state / "connectors",
        context=launch_context,
        notify=notify,
        routes=app[ROUTES],
        http_auth=app[OAUTH],
        sandbox=sandbox,
        limits=PoolLimits(
            per_connector=limits.max_per_connector,
            total=limits.max_total,
            idle_seconds=limits.idle_seconds,
            start_timeout=limits.start_timeout,
            per_session=limits.session_share,
            spares=limits.spares,
            share_all=limits.share_processes,
        ),
        sessions=sessions,
        billing=app[BILLING],
        deferral=Deferral(default=settings.tools.defer_connectors, direct=frozenset(settings.tools.direct_connectors)),
    )
    sessions.subscribe(lambda session, event: service.session_ended(session.id) if event in _GONE else None)
    app[OAUTH].subscribe(lambda connector_id, event: _on_sign_in(service, app[TRUST], connector_id, event))
    # Each remote connector's sign-in state as stored (``ready`` after a restart), before any call.
    remote = [c.spec for c in manager.list() if c.spec.launch.transport == "http" or c.spec.oauth is not None]
    await app[OAUTH].load({spec.id: spec.launch.oauth is not None or spec.oauth is not None for spec in remote})
    watched = [paths.config, paths.data / "plugins", paths.data / "connectors", SHIPPED_CONNECTORS]
    for directory in watched[1:3]:
        ensure_private_dir(directory)
    watcher = ConfigWatcher(
        directories=watched if limits.watch else (),
        refresh=manager.refresh,
        sources=lambda: [c.spec.origin for c in manager.list()],
    )
    async with watcher.run():
        yield
        await service.close()  # every connector process, bounded by each one's stop escalation


async def _on_sign_in(service: ConnectorService, trust: TrustStore, connector_id: str, event: str) -> None:
    """A sign-in completed: connections and processes made under the old grant end (a server may bind its
    MCP sessions to the credential that opened them; a package's processes whose internal-API credentials
    a revoke ended start afresh) and reopen on the next call; a connector whose tools could not be learned
    at trust (it needed the sign-in) learns them. Revoked: a remote connector's connections end; a
    package's processes stay (their next internal-API call gets 401 and they say so to the agent)."""
    if event == "signed_in":
        await service.disconnect(connector_id)
        connector = service.manager.get(connector_id)
        if not service.tools.offers(connector_id) and trust.is_trusted(connector.key):
            await service.trust(connector_id)
    elif event == "revoked" and service.manager.get(connector_id).spec.oauth is None:
        await service.disconnect(connector_id)


async def _edge(app: web.Application) -> AsyncIterator[None]:
    settings, inflight, hub, sessions, tools = app[SETTINGS], app[INFLIGHT], app[HUB], app[SESSIONS], app[TOOLS]
    connectors = app[CONNECTORS]
    server = build_mcp_server(tools=tools, sessions=sessions, hub=hub, catalog=connectors.catalog)
    relay = Relay(connectors=connectors, tools=tools, sessions=sessions)
    seen = sessions.note_client
    endpoint = app[MCP_ENDPOINT] = McpEndpoint(
        server, settings=settings, inflight=inflight, hub=hub, quiet=quiet_call(tools, sessions), clients=seen
    )
    relay_endpoint = app[RELAY_ENDPOINT] = McpEndpoint(
        relay.server(), settings=settings, inflight=inflight, hub=hub, clients=seen
    )
    app[REST] = RestFacade(registry=app[REGISTRY], tools=tools, sessions=sessions, limits=settings.limits)
    forwarder = Forwarder()
    app[INTERNAL_API] = InternalApi(
        credentials=app[PROCESS_CREDENTIALS],
        sessions=sessions,
        upstream_of=lambda connector_id: _upstream_of(app, connector_id),
        keeper=app[OAUTH].keeper,
        forwarder=forwarder,
        audit=app[AUDIT].append,
        refusals=app[REFUSALS],
        limits=settings.limits,
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(forwarder.close)
        await stack.enter_async_context(endpoint.run())
        await stack.enter_async_context(relay_endpoint.run())
        app[ROUTES].register(PROXY_ROUTE, path="/mcp")
        connectors.start()  # cached tools of connectors trusted earlier, and their own routes
        app[ROUTES].drop_unclaimed()  # tokens of an earlier run whose route is not mounted now
        yield
        await _revoke_all(app)


def _upstream_of(app: web.Application, connector_id: str) -> UpstreamRule | None:
    """The internal API's rule for a connector: its declared upstream, while it is trusted as configured."""
    try:
        connector = app[CONNECTORS].manager.get(connector_id)
    except NotFound:
        return None
    oauth = connector.spec.oauth
    if oauth is None or not app[TRUST].is_trusted(connector.key):
        return None
    return UpstreamRule.of(oauth.upstream)


async def _revoke_all(app: web.Application) -> None:
    """Stopping revokes every token in this process: sessions end, then routes go, each aborting what runs
    on it. The journal is closed first: the next start takes them up again, until they expire."""
    with contextlib.suppress(KeyError):  # start-up failed before the auth subsystem
        app[STATE].close()
        app[SESSIONS].close_all()
        routes = app[ROUTES]
        for route in routes.list():
            routes.unregister(route.name)


def _add_routes(app: web.Application) -> None:
    async def mcp(request: web.Request) -> web.StreamResponse:
        return await request.app[MCP_ENDPOINT].handle(request, request[PRINCIPAL])

    async def relayed(request: web.Request) -> web.StreamResponse:
        return await request.app[RELAY_ENDPOINT].handle(request, request[PRINCIPAL])

    async def internal(request: web.Request) -> web.Response:
        return await request.app[INTERNAL_API].handle(request)

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/mcp", mcp)
    app.router.add_route("*", "/mcp/connectors/{connector_id}", relayed)
    app.router.add_route("*", INTERNAL_ROUTE, internal)
    add_rest_routes(app, lambda request: request.app[REST])
    add_control_routes(app)
    add_console_routes(app)


def billing_sources(settings: Settings, paths: Paths) -> list[ManifestSource]:
    """The built-in tools' manifests: the shipped one (required) and the user's own (optional)."""
    shipped = Path(settings.tools.billing_manifest) if settings.tools.billing_manifest else SHIPPED_BILLING
    return [
        ManifestSource(scope="builtin", path=shipped, required=True),
        ManifestSource(scope="builtin", path=paths.config / "high-credit-tools.json", required=False),
    ]


def _on_session(hub: ChangeHub, approvals: ApprovalStore, session: Session, event: str) -> None:
    """A grant that changed reaches the session's clients; an ended session's state goes with it."""
    if event == "updated":
        hub.announce([session.id])
    elif event in _GONE:
        hub.forget(session.id)
        approvals.forget_session(session.id)
