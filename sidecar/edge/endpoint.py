"""``/mcp``: MCP Streamable HTTP (both protocol eras) served from aiohttp through the SDK's manager.

The SDK's ``StreamableHTTPSessionManager`` owns the protocol (sessions, SSE, the GET stream, DELETE,
2026-07-28 single exchanges). We own everything before it: the guard and auth middlewares have run
by the time ``McpEndpoint.handle`` sees a request, which reads the body within limits, binds the
transport session to the caller (SDK session ownership: another token or envelope gets 404), and
registers the exchange so that revoking its route or session aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiohttp import web
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CLIENT_INFO_META_KEY

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.principal import SCOPE_KEY, Principal
from sidecar.auth.routes import route_key
from sidecar.auth.sessions import session_key
from sidecar.config import Settings
from sidecar.edge.asgi import AsgiExchange, DisconnectWatcher
from sidecar.edge.jsonanswer import QuietCall
from sidecar.edge.mcp import CALLER, ChangeHub
from sidecar.errors import UnsupportedMediaType
from sidecar.net.body import read_jsonrpc
from sidecar.seams.sdk_streamable import JSON_ANSWER, JsonAnsweringManager, is_modern

__all__ = ["ClientSeen", "McpEndpoint"]

logger = logging.getLogger(__name__)

MANAGER_STOP_TIMEOUT: Final = 5.0
"""Seconds the SDK manager gets to close its sessions at shutdown before its task is cancelled."""


ClientSeen = Callable[[str, object], None]
"""Told (session id, ``clientInfo``) when a request names its client."""


def _client_info(message: dict[str, Any]) -> object:
    params = message.get("params")
    if not isinstance(params, dict):
        return None
    if message.get("method") == "initialize":
        return params.get("clientInfo")
    meta = params.get("_meta")
    return meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else None


class McpEndpoint:
    """The aiohttp side of ``/mcp``; ``run()`` is the manager's lifetime (an async context manager)."""

    def __init__(
        self,
        server: Any,
        *,
        settings: Settings,
        inflight: InflightTracker,
        hub: ChangeHub,
        quiet: QuietCall | None = None,
        clients: ClientSeen | None = None,
    ) -> None:
        """``quiet`` picks the 2026-07-28 requests answered with one JSON body (``edge/jsonanswer.py``);
        none without it. Every 2025-era request is answered in JSON unless it streams first. ``clients``
        is told the ``clientInfo`` a request carries (an ``initialize``, or a 2026-07-28 request's
        ``_meta``), with the caller's session id."""
        self._quiet = quiet
        self._clients = clients
        self._settings = settings
        self._inflight = inflight
        self._hub = hub
        self._watcher = DisconnectWatcher()
        self._manager = JsonAnsweringManager(
            server,
            json_response=settings.mcp.json_response,
            # The guard middleware has already enforced Host/Origin with a 403 (the SDK answers 421,
            # which the conformance suite rejects). The SDK still checks Content-Type and body size.
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=False,
            ),
            session_idle_timeout=settings.mcp.session_idle_timeout,
            max_request_body_size=settings.limits.max_body_bytes,
            max_sessions=settings.mcp.max_sessions,
        )

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Run the SDK manager in a task of its own: anyio scopes must exit in the task that entered them."""
        started = asyncio.Event()
        stop = asyncio.Event()

        async def hold() -> None:
            async with self._manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(hold(), name="mcp-session-manager")
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()  # raises the manager's start-up error
        try:
            yield
        finally:
            await self._watcher.close()
            stop.set()
            try:
                await asyncio.wait_for(task, MANAGER_STOP_TIMEOUT)
            except (TimeoutError, asyncio.CancelledError):
                logger.warning("MCP session manager did not stop within %ss", MANAGER_STOP_TIMEOUT)

    async def handle(self, request: web.Request, principal: Principal) -> web.StreamResponse:
        body = b""
        message: Any = None
        if request.method == "POST":
            # The SDK would answer a wrong type with a plain-text 400; answer in our JSON shape instead.
            if request.content_type != "application/json":
                raise UnsupportedMediaType("POST /mcp needs Content-Type: application/json")
            body, message = await read_jsonrpc(request, self._settings.limits)
            if self._clients is not None and isinstance(message, dict):
                info = _client_info(message)
                if info is not None:
                    self._clients(principal.session_id, info)
        transport_id = request.headers.get("mcp-session-id")
        if request.method == "DELETE" and transport_id:
            self._hub.forget_transport(principal.session_id, transport_id)
        scope: dict[str, Any] = {
            SCOPE_KEY: principal,
            # SDK session ownership: a transport session opened by one (route token, session) pair
            # answers 404 to any other (contract §4).
            "user": AuthenticatedUser(AccessToken(token="-", client_id=principal.owner_id, scopes=[])),  # noqa: S106
        }
        if is_modern(request.headers.get("mcp-protocol-version")):
            if self._quiet is not None and self._quiet(principal, message):
                scope[JSON_ANSWER] = message  # nothing will be streamed: one JSON body (edge/jsonanswer.py)
        elif (
            transport_id
            and isinstance(message, dict)
            and "id" in message
            and message.get("method") not in (None, "initialize")
        ):
            scope[JSON_ANSWER] = message  # a 2025-era request: JSON unless it streams first (edge/jsonanswer.py)
        request_id = message.get("id") if isinstance(message, dict) and "method" in message else None
        exchange = AsgiExchange(
            request,
            body,
            scope,
            watcher=self._watcher,
            request_id=request_id if isinstance(request_id, str | int) else None,
        )
        keys = (route_key(principal.route), session_key(principal.session_id))
        token = CALLER.set(principal)
        try:
            with self._inflight.track(keys, exchange.abort):
                return await exchange.run(self._manager.handle_request)
        finally:
            CALLER.reset(token)
