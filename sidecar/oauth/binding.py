"""A sign-in finishes only in the browser that started it.

The ``state`` of an authorization URL names a flow, but it travels through the authorization server
and the browser's history, and it used to travel through a browser's command line too. So ``state``
alone does not finish a sign-in: the browser must also show the flow's cookie, which only a browser
that opened the flow's **start link** holds.

- ``link(origin)`` mints a start link, ``<origin>/oauth/start?flow=…&key=…``: its key is single use and
  is the secret (the CLI hands it to the browser through a private file, never on a command line).
- ``spend(key)`` is the start page's work: the key is used up and a fresh cookie value is minted for
  that browser (``Path=/oauth/callback``, ``HttpOnly``, ``SameSite=Lax`` so the redirect back from the
  authorization server carries it). Several ``connect`` calls may join one flow: each gets its own link.
- ``admits(cookies)`` is the callback's check, before the flow's ``state`` is spent.

Only SHA-256 digests of keys and cookie values are kept.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Final, NamedTuple
from urllib.parse import urlencode

__all__ = ["COOKIE_PREFIX", "START_PATH", "BrowserBinding", "FlowCookie"]

START_PATH: Final = "/oauth/start"
COOKIE_PREFIX: Final = "sidecar_signin_"
_SECRET_BYTES: Final = 32
_MAX_LINKS: Final = 16
"""Start links one flow keeps open; joining a flow more often than this forgets the oldest."""


class FlowCookie(NamedTuple):
    name: str
    value: str


class BrowserBinding:
    """One flow's unspent start keys and the cookie values of the browsers they were spent in."""

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self._keys: list[bytes] = []
        self._browsers: set[bytes] = set()

    @property
    def cookie_name(self) -> str:
        return COOKIE_PREFIX + self.flow_id

    def link(self, origin: str) -> str:
        """A new single-use start link for this flow on the daemon at ``origin``."""
        key = secrets.token_urlsafe(_SECRET_BYTES)
        self._keys.append(_digest(key))
        del self._keys[:-_MAX_LINKS]
        return f"{origin}{START_PATH}?{urlencode({'flow': self.flow_id, 'key': key})}"

    def spend(self, key: str) -> FlowCookie | None:
        """The start link's key used up, and the cookie for the browser that brought it; None if the
        key is not one of this flow's unspent keys."""
        digest = _digest(key)
        if digest not in self._keys:
            return None
        self._keys.remove(digest)
        value = secrets.token_urlsafe(_SECRET_BYTES)
        self._browsers.add(_digest(value))
        return FlowCookie(self.cookie_name, value)

    def admits(self, cookies: Mapping[str, str]) -> bool:
        """True when ``cookies`` hold a value minted by ``spend`` for this flow."""
        value = cookies.get(self.cookie_name)
        return value is not None and _digest(value) in self._browsers


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()
