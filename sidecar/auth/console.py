"""The web console's credentials: one-time sign-in codes, and the browser sessions they turn into.

``sidecar ui`` asks the daemon (control API, control token) for a **one-time code**: 256 random bits,
spent by its first exchange, dead after ``CODE_TTL`` seconds. The browser brings it to ``/ui/signin``
once; the daemon answers with a **console session**: a cookie value (256 bits, ``HttpOnly``) and a CSRF
token (256 bits) that the console page reads from its own HTML and sends back in a header on every
state-changing request. The control token never reaches the browser.

Cookies ignore ports, so another page served on loopback could be handed the cookie; it is worthless
alone: a state change also needs the CSRF token (which only the console's own page can read) and the
daemon's own ``Origin`` (checked by the console's routes). Only digests are held here: a leaked memory
image holds no usable code or cookie. Everything lives in memory: a restart signs the browser out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sidecar.auth.encoding import mint_token, token_digest, tokens_equal

__all__ = ["CODE_TTL", "SESSION_TTL", "ConsoleSession", "ConsoleSignIn", "cookie_name"]

CODE_TTL: Final = 60.0
"""Seconds a one-time sign-in code lives (issue 14: single use, 60 s)."""
SESSION_TTL: Final = 12 * 3600.0
"""Seconds a console session (the cookie) lives; ``sidecar ui`` again after that."""
MAX_CODES: Final = 32
"""Unspent codes held at once; the oldest is dropped beyond it (each ``sidecar ui`` mints one)."""
MAX_SESSIONS: Final = 32
"""Console sessions held at once; the oldest is dropped beyond it."""
_MAX_PRESENTED: Final = 128
"""Longest code or cookie value looked at; ours are 43 characters."""


def cookie_name(port: int) -> str:
    """The console cookie's name. Cookies ignore ports: the port in the name keeps two daemons' apart."""
    return f"sidecar_console_{port}"


def _digest(value: str) -> bytes:
    """The dict key of a code or cookie value; a non-ASCII one (never minted) keys nothing that exists."""
    try:
        return token_digest(value)
    except ValueError:
        return b""


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """One signed-in browser: its CSRF token and when it expires. The cookie itself is not kept."""

    csrf: str
    expires_at: float

    def csrf_matches(self, presented: str | None) -> bool:
        # SECURITY: constant-time comparison (tokens_equal: False for non-ASCII, never a TypeError).
        return presented is not None and len(presented) <= _MAX_PRESENTED and tokens_equal(presented, self.csrf)


class ConsoleSignIn:
    """Mint and spend one-time codes; look up console sessions by cookie value."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: dict[bytes, float] = {}  # sha256(code) -> expiry
        self._sessions: dict[bytes, ConsoleSession] = {}  # sha256(cookie) -> session

    def mint_code(self) -> str:
        """A fresh one-time code, valid for ``CODE_TTL`` seconds and one exchange."""
        now = self._clock()
        self._prune(now)
        code = mint_token()
        self._codes[_digest(code)] = now + CODE_TTL
        while len(self._codes) > MAX_CODES:
            del self._codes[next(iter(self._codes))]
        return code

    def exchange(self, code: str | None) -> tuple[str, ConsoleSession] | None:
        """Spend ``code``: a new (cookie value, session), or None if it is unknown, spent or expired."""
        if code is None or len(code) > _MAX_PRESENTED:
            return None
        now = self._clock()
        # SECURITY: popped before anything else, so a code is spent by its first use, valid or late.
        expires = self._codes.pop(_digest(code), None)
        if expires is None or expires <= now:
            return None
        cookie = mint_token()
        session = ConsoleSession(csrf=mint_token(), expires_at=now + SESSION_TTL)
        self._prune(now)
        self._sessions[_digest(cookie)] = session
        while len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return cookie, session

    def session(self, cookie: str | None) -> ConsoleSession | None:
        """The live console session a cookie value names, or None."""
        if cookie is None or len(cookie) > _MAX_PRESENTED:
            return None
        # A dict lookup by SHA-256 digest: what is compared is not the secret itself (as for route tokens).
        session = self._sessions.get(_digest(cookie))
        if session is None or session.expires_at <= self._clock():
            return None
        return session

    def sign_out(self, cookie: str | None) -> None:
        if cookie is not None and len(cookie) <= _MAX_PRESENTED:
            self._sessions.pop(_digest(cookie), None)

    def _prune(self, now: float) -> None:
        for key in [k for k, expires in self._codes.items() if expires <= now]:
            del self._codes[key]
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[key]
