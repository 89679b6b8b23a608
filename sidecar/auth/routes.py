"""Route tokens (contract §4): each mounted MCP route has its own bearer token, valid while it is registered.

Tokens are looked up by SHA-256 digest and compared in constant time; the token itself stays in memory
only, so the control API can give it to new sessions. Unregistering or rotating a route
aborts every in-flight request and stream on it through the ``InflightTracker``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from sidecar.auth.encoding import check_token, mint_token, token_digest
from sidecar.auth.inflight import InflightTracker
from sidecar.errors import Conflict, NotFound, Unauthorized

__all__ = ["Route", "RouteRegistry", "route_key"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9:._-]{0,127}$")
_NO_ROUTE_DIGEST: Final = b"\x00" * 32
"""What a token for an unregistered route is compared against (no token has this SHA-256)."""

RouteListener = Callable[[str, str], None]
"""Called with (route name, event) where event is ``registered``, ``rotated`` or ``unregistered``."""


def route_key(name: str) -> tuple[str, str]:
    """The in-flight key for everything running on a route."""
    return ("route", name)


@dataclass(slots=True)
class Route:
    """A registered route. ``generation`` changes on every rotation, so MCP sessions bind to one token."""

    name: str
    path: str
    digest: bytes
    generation: int
    token: str = field(repr=False)
    """Kept in memory so the control API can hand it to new sessions; never logged or written."""
    minted_at: float = field(default_factory=time.time)


class RouteRegistry:
    """Mint, check, rotate and revoke route tokens."""

    def __init__(self, inflight: InflightTracker, *, on_event: RouteListener | None = None) -> None:
        self._routes: dict[str, Route] = {}
        self._inflight = inflight
        self._on_event = on_event
        self._generation = 0

    def register(self, name: str, *, path: str) -> str:
        """Register ``name`` at ``path`` and return its new token; a name may be registered once."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid route name {name!r}")
        if name in self._routes:
            raise Conflict(f"route {name!r} is already registered")
        token = self._mint(name, path)
        self._emit(name, "registered")
        return token

    def rotate(self, name: str) -> str:
        """Re-mint ``name``'s token: the old one stops working and its in-flight requests are aborted."""
        route = self._routes.get(name)
        if route is None:
            raise NotFound(_no_route(name))
        token = self._mint(name, route.path)
        aborted = self._inflight.abort(route_key(name))
        logger.info("rotated the token of route %s; aborted %d in-flight requests", name, aborted)
        self._emit(name, "rotated")
        return token

    def unregister(self, name: str) -> int:
        """Revoke ``name``'s token and abort everything in flight on it; return how many were aborted."""
        if self._routes.pop(name, None) is None:
            raise NotFound(_no_route(name))
        aborted = self._inflight.abort(route_key(name))
        logger.info("unregistered route %s; aborted %d in-flight requests", name, aborted)
        self._emit(name, "unregistered")
        return aborted

    def authenticate(self, name: str, presented: str | None) -> Route:
        """Return the route if ``presented`` is its current token; else raise ``Unauthorized``."""
        route = self._routes.get(name)
        # SECURITY: an unknown route compares against a dummy digest, so timing does not tell registered
        # names apart.
        expected = route.digest if route is not None else _NO_ROUTE_DIGEST
        check_token(presented, expected, what="bearer token for this route")
        if route is None:
            raise Unauthorized("invalid bearer token for this route")
        return route

    def get(self, name: str) -> Route | None:
        return self._routes.get(name)

    def list(self) -> list[Route]:
        return sorted(self._routes.values(), key=lambda r: r.name)

    def _mint(self, name: str, path: str) -> str:
        token = mint_token()
        self._generation += 1
        self._routes[name] = Route(
            name=name, path=path, digest=token_digest(token), generation=self._generation, token=token
        )
        return token

    def _emit(self, name: str, event: str) -> None:
        if self._on_event is not None:
            self._on_event(name, event)


def _no_route(name: str) -> str:
    """The answer to a route name that is not registered: the name only if it could be one (the control
    API takes it from the request path, where it may be any bytes; issue 11 item 3)."""
    if _NAME.fullmatch(name):
        return f"no route named {name} (see: sidecar routes list)"
    return "no route by that name (see: sidecar routes list)"
