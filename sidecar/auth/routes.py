"""Route tokens (contract §4): each mounted MCP route has its own bearer token, valid while it is registered.

Tokens are looked up by SHA-256 digest and compared in constant time; the token itself stays in memory
only, so the control API can give it to new sessions. Unregistering or rotating a route
aborts every in-flight request and stream on it through the ``InflightTracker``.

A token survives a daemon restart until the sessions it was handed to expire (issue 14 item 5): each
token handed out (``issue``) is remembered as its digest and the latest expiry of those sessions, and a
``TokenJournal`` keeps that list on disk. The next daemon mints a new token for each route (it never
knew the old one, only its digest) and accepts the old ones, *carried*, until their expiry. Rotating
or unregistering a route ends its carried tokens with its current one, and the journal records that.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from sidecar.auth.encoding import check_token, mint_token, token_digest
from sidecar.auth.inflight import InflightTracker
from sidecar.errors import Conflict, NotFound, Unauthorized

__all__ = ["CarriedToken", "Route", "RouteMatch", "RouteRegistry", "TokenJournal", "route_key"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9:._-]{0,127}$")
_NO_ROUTE_DIGEST: Final = b"\x00" * 32
"""What a token for an unregistered route is compared against (no token has this SHA-256)."""

RouteListener = Callable[[str, str], None]
"""Called with (route name, event) where event is ``registered``, ``rotated`` or ``unregistered``."""


@dataclass(frozen=True, slots=True)
class CarriedToken:
    """A token handed out, as the journal keeps it: its SHA-256 and when the last session it went to expires."""

    digest: bytes
    until: int


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """Which route a presented token opened, and which token of it (its ``generation``)."""

    name: str
    generation: int


class TokenJournal(Protocol):
    """Where the tokens handed out are kept across restarts (``auth.persist.StateJournal``)."""

    def tokens_changed(self, tokens: Mapping[str, Sequence[CarriedToken]]) -> None: ...


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
    issued_until: int = 0
    """When the last session this token was handed to expires (0: not handed out yet)."""
    carried: dict[bytes, tuple[int, int]] = field(default_factory=dict, repr=False)
    """Tokens of this route handed out before the daemon restarted: digest -> (generation, until)."""

    def journal(self, now: float) -> list[CarriedToken]:
        """The tokens of this route a restarted daemon must accept, and until when."""
        kept = [CarriedToken(d, until) for d, (_, until) in self.carried.items() if until > now]
        if self.issued_until > now:
            kept.append(CarriedToken(self.digest, self.issued_until))
        return kept


class RouteRegistry:
    """Mint, check, rotate and revoke route tokens."""

    def __init__(
        self,
        inflight: InflightTracker,
        *,
        on_event: RouteListener | None = None,
        journal: TokenJournal | None = None,
        carried: Mapping[str, Sequence[CarriedToken]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``carried``: the tokens of an earlier run (from the journal), each route's taken up when it is
        registered; ``drop_unclaimed`` forgets the rest once start-up has registered every route."""
        self._routes: dict[str, Route] = {}
        self._inflight = inflight
        self._on_event = on_event
        self._journal = journal
        self._unclaimed = {name: list(tokens) for name, tokens in (carried or {}).items()}
        self._clock = clock
        self._generation = 0

    def register(self, name: str, *, path: str) -> str:
        """Register ``name`` at ``path`` and return its new token; a name may be registered once."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid route name {name!r}")
        if name in self._routes:
            raise Conflict(f"route {name!r} is already registered")
        token = self._mint(name, path)
        route = self._routes[name]
        for old in self._unclaimed.pop(name, ()):
            self._generation += 1
            route.carried[old.digest] = (self._generation, old.until)
        self._emit(name, "registered")
        return token

    def drop_unclaimed(self) -> None:
        """Forget the earlier run's tokens of routes not registered now (a connector no longer trusted):
        trusting it again later mints a new token, as it always does."""
        if self._unclaimed:
            logger.info("tokens of routes not mounted now are forgotten: %s", ", ".join(sorted(self._unclaimed)))
            self._unclaimed.clear()
            self._save()

    def issue(self, name: str, *, until: int) -> str:
        """The current token of ``name``, to hand to a session that expires at ``until``: it stays valid
        across daemon restarts until then (unless the route is rotated or unregistered)."""
        route = self._routes.get(name)
        if route is None:
            raise NotFound(_no_route(name))
        if until > route.issued_until:
            route.issued_until = until
            self._save()
        return route.token

    def rotate(self, name: str) -> str:
        """Re-mint ``name``'s token: the old one stops working and its in-flight requests are aborted."""
        route = self._routes.get(name)
        if route is None:
            raise NotFound(_no_route(name))
        token = self._mint(name, route.path)
        aborted = self._inflight.abort(route_key(name))
        logger.info("rotated the token of route %s; aborted %d in-flight requests", name, aborted)
        self._save()  # SECURITY: the old tokens, carried ones too, must stay dead after a restart
        self._emit(name, "rotated")
        return token

    def unregister(self, name: str) -> int:
        """Revoke ``name``'s token and abort everything in flight on it; return how many were aborted."""
        if self._routes.pop(name, None) is None:
            raise NotFound(_no_route(name))
        aborted = self._inflight.abort(route_key(name))
        logger.info("unregistered route %s; aborted %d in-flight requests", name, aborted)
        self._save()
        self._emit(name, "unregistered")
        return aborted

    def authenticate(self, name: str, presented: str | None) -> RouteMatch:
        """Which token of route ``name`` ``presented`` is (its current one, or one carried over a restart
        and not yet expired); else raise ``Unauthorized``."""
        route = self._routes.get(name)
        if route is not None and route.carried and presented is not None:
            matched = _carried_match(route.carried, presented, self._clock())
            if matched is not None:
                return RouteMatch(route.name, matched)
        # SECURITY: an unknown route compares against a dummy digest, so timing does not tell registered
        # names apart.
        expected = route.digest if route is not None else _NO_ROUTE_DIGEST
        check_token(presented, expected, what="bearer token for this route")
        if route is None:
            raise Unauthorized("invalid bearer token for this route")
        return RouteMatch(route.name, route.generation)

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

    def _save(self) -> None:
        if self._journal is None:
            return
        now = self._clock()
        tokens = {name: route.journal(now) for name, route in self._routes.items()}
        for name, unclaimed in self._unclaimed.items():
            tokens.setdefault(name, [t for t in unclaimed if t.until > now])
        self._journal.tokens_changed({name: kept for name, kept in tokens.items() if kept})

    def _emit(self, name: str, event: str) -> None:
        if self._on_event is not None:
            self._on_event(name, event)


def _carried_match(carried: Mapping[bytes, tuple[int, float]], presented: str, now: float) -> int | None:
    """The generation of the unexpired carried token ``presented`` is, or None. The token is hashed once;
    SECURITY: every carried digest is compared, in constant time, whichever matches."""
    try:
        digest = token_digest(presented)
    except ValueError:  # not ASCII: never a minted token
        return None
    matched = [
        generation
        for known, (generation, until) in carried.items()
        if hmac.compare_digest(known, digest) and until > now
    ]
    return matched[0] if matched else None


def _no_route(name: str) -> str:
    """The answer to a route name that is not registered: the name only if it could be one (the control
    API takes it from the request path, where it may be any bytes; issue 11 item 3)."""
    if _NAME.fullmatch(name):
        return f"no route named {name} (see: sidecar routes list)"
    return "no route by that name (see: sidecar routes list)"
