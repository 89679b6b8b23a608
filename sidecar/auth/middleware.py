"""Who may call which route: control token, route token + session envelope, or nothing (``/healthz``).

Runs right after the network guard. A missing or wrong bearer token is 401 with
``WWW-Authenticate: Bearer``; a missing, bad, expired or unknown envelope is 403 (contract §4). Tokens are
read from ``Authorization: Bearer`` only, never from the URL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from sidecar.auth.encoding import check_token
from sidecar.auth.principal import Principal
from sidecar.auth.routes import RouteRegistry
from sidecar.auth.sessions import SessionStore
from sidecar.errors import EnvelopeRejected, Unauthorized
from sidecar.names import PROXY_ROUTE, connector_route, refusal_route
from sidecar.net.guard import Refused

__all__ = ["PRINCIPAL", "bearer_token", "make_auth_middleware", "route_for_path", "session_envelope"]

logger = logging.getLogger(__name__)

PRINCIPAL = web.RequestKey("principal", Principal)
CONTEXT_HEADER = "X-Sidecar-Context"


def bearer_token(request: web.Request) -> str | None:
    """The token of the single ``Authorization: Bearer`` header, or None; two headers are refused."""
    values = request.headers.getall("Authorization", [])
    if not values:
        return None
    if len(values) > 1:
        raise Unauthorized("more than one Authorization header")
    scheme, _, token = values[0].partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("use Authorization: Bearer <token>")
    return token.strip()


def session_envelope(request: web.Request) -> str | None:
    """The single ``X-Sidecar-Context`` header's value, or None (none, or more than one: no session)."""
    contexts = request.headers.getall(CONTEXT_HEADER, [])
    return contexts[0] if len(contexts) == 1 else None


def route_for_path(path: str) -> str | None:
    """The route whose token guards ``path`` (None: not a token route)."""
    if path == "/mcp" or path.startswith("/api/v1/"):
        return PROXY_ROUTE
    prefix = "/mcp/connectors/"
    if path.startswith(prefix):
        connector = path[len(prefix) :].split("/", 1)[0]
        return connector_route(connector) if connector else None
    return None


def make_auth_middleware(
    *,
    routes: Callable[[], RouteRegistry],
    sessions: Callable[[], SessionStore],
    control_digest: Callable[[], bytes],
    refused: Refused = lambda route, reason: True,
) -> Middleware:
    """Authenticate by path: ``/control`` → control token; token routes → route token + envelope.

    ``routes`` and ``sessions`` give the app's registries, which exist once the app has started. Each
    refusal is counted (``refused``): nothing is written per request.
    """

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        try:
            if path == "/control" or path.startswith("/control/"):
                check_token(bearer_token(request), control_digest(), what="control token")
            elif (route_name := route_for_path(path)) is not None:
                match = routes().authenticate(route_name, bearer_token(request))
                session = sessions().verify(session_envelope(request))
                request[PRINCIPAL] = Principal(route=match.name, generation=match.generation, session_id=session.id)
        except (Unauthorized, EnvelopeRejected) as err:
            refused(refusal_route(path), err.code)
            raise
        return await handler(request)

    return auth
