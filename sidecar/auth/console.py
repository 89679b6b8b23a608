"""The web console's credentials: one-time sign-in codes, and the browser sessions they turn into.

``sidecar ui`` asks the daemon (control API, control token) for a **one-time code**: 256 random bits,
spent by its first exchange, dead after ``CODE_TTL`` seconds. The console's sign-in page, opened with the
code in its address's fragment (never sent to a server), exchanges it by script for a **session
secret** (256 bits), which the page keeps in ``sessionStorage`` and sends as a header on every
``/ui/api/`` request. The control token never reaches the browser.

Why not a cookie: browsers send cookies to every port of a host, so a server on another loopback port
(another user's, say) would be handed it and could replay it. ``sessionStorage`` belongs to one origin,
port included, and a header is never sent by the browser on its own; the served HTML holds no secret.

A session ends when it is signed out, after ``IDLE_TTL`` seconds without a request, or ``SESSION_TTL``
seconds after sign-in, whichever comes first. Only digests are held here: a leaked memory image holds no
usable code or secret. Everything lives in memory: a restart signs the browser out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sidecar.auth.encoding import mint_token, token_digest

__all__ = ["CODE_TTL", "IDLE_TTL", "SESSION_TTL", "ConsoleSession", "ConsoleSignIn"]

CODE_TTL: Final = 60.0
"""Seconds a one-time sign-in code lives (issue 14: single use, 60 s)."""
SESSION_TTL: Final = 12 * 3600.0
"""Seconds a console session lives at most; ``sidecar ui`` again after that."""
IDLE_TTL: Final = 1800.0
"""Seconds a console session lives without a request (the page polls every few seconds while open)."""
MAX_CODES: Final = 32
"""Unspent codes held at once; the oldest is dropped beyond it (each ``sidecar ui`` mints one)."""
MAX_SESSIONS: Final = 32
"""Console sessions held at once; the oldest is dropped beyond it."""
_MAX_PRESENTED: Final = 128
"""Longest code or secret looked at; ours are 43 characters."""


def _digest(value: str) -> bytes:
    """The dict key of a code or secret; a non-ASCII one (never minted) keys nothing that exists."""
    try:
        return token_digest(value)
    except ValueError:
        return b""


@dataclass(slots=True)
class ConsoleSession:
    """One signed-in browser tab: when it ends at the latest, and when it was last used."""

    expires_at: float
    last_used: float


class ConsoleSignIn:
    """Mint and spend one-time codes; look up console sessions by their secret."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._codes: dict[bytes, float] = {}  # sha256(code) -> expiry
        self._sessions: dict[bytes, ConsoleSession] = {}  # sha256(secret) -> session

    def mint_code(self) -> str:
        """A fresh one-time code, valid for ``CODE_TTL`` seconds and one exchange."""
        now = self._clock()
        self._prune(now)
        code = mint_token()
        self._codes[_digest(code)] = now + CODE_TTL
        while len(self._codes) > MAX_CODES:
            del self._codes[next(iter(self._codes))]
        return code

    def exchange(self, code: str | None) -> str | None:
        """Spend ``code``: a new session's secret, or None if the code is unknown, spent or expired."""
        if code is None or len(code) > _MAX_PRESENTED:
            return None
        now = self._clock()
        # SECURITY: popped before anything else, so a code is spent by its first use, valid or late.
        expires = self._codes.pop(_digest(code), None)
        if expires is None or expires <= now:
            return None
        secret = mint_token()
        self._prune(now)
        self._sessions[_digest(secret)] = ConsoleSession(expires_at=now + SESSION_TTL, last_used=now)
        while len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return secret

    def session(self, secret: str | None) -> ConsoleSession | None:
        """The live console session ``secret`` names (now used again), or None."""
        if secret is None or len(secret) > _MAX_PRESENTED:
            return None
        now = self._clock()
        # A dict lookup by SHA-256 digest: what is compared is not the secret itself (as for route tokens).
        key = _digest(secret)
        session = self._sessions.get(key)
        if session is None:
            return None
        if session.expires_at <= now or now - session.last_used >= IDLE_TTL:
            del self._sessions[key]
            return None
        session.last_used = now
        return session

    def sign_out(self, secret: str | None) -> None:
        if secret is not None and len(secret) <= _MAX_PRESENTED:
            self._sessions.pop(_digest(secret), None)

    def _prune(self, now: float) -> None:
        for key in [k for k, expires in self._codes.items() if expires <= now]:
            del self._codes[key]
        for key in [k for k, s in self._sessions.items() if s.expires_at <= now or now - s.last_used >= IDLE_TTL]:
            del self._sessions[key]
