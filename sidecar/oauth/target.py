"""Where an internal-API request may go: the package's declared upstream, and nowhere else (contract §7).

``UpstreamRule.resolve(method, raw_path, raw_query)`` turns the part of ``/mcp/internal/<id>/api/<path>``
after ``api`` into the one URL it may reach under ``upstream.base_url``, or refuses:

- the raw path is checked **before** any decoding: only RFC 3986 path characters; no ``@``, no
  backslash, no ``..`` or ``.`` segment, no empty segment, and no percent-escape of ``/``, ``\\``, ``.``,
  ``@``, ``%``, ``?``, ``#`` or a control character (an encoded slash or dot is how a path is turned
  into another after a proxy decodes it);
- the (decoded) path must start with one of the declared prefixes, and the method must be declared;
- the URL is built by concatenation onto the base URL, then parsed again: its scheme, host and port
  must be the base's and its path must stay under the base's path. Whatever slips past the rules above
  still cannot name another host.

Refusals are ``Forbidden`` (403); nothing has been sent anywhere by then. ``template`` is what the audit
records: the matched prefix and ``*``, never the caller's path itself (it may name a user's data).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

from sidecar.errors import Forbidden
from sidecar.oauth.declared import UpstreamApi

__all__ = ["Target", "UpstreamRule"]

_RAW_PATH: Final = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:/%-]*")
_RAW_QUERY: Final = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:/?%@-]*")
_ESCAPE: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_BAD_ESCAPES: Final = frozenset({0x2F, 0x5C, 0x2E, 0x40, 0x25, 0x3F, 0x23}) | frozenset(range(0x20)) | {0x7F}
"""Percent-escapes refused in a path: ``/ \\ . @ % ? #`` and control characters."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    template: str


class UpstreamRule:
    """One package's ``upstream``: base URL, path prefixes, methods, the ``X-`` headers it may send."""

    def __init__(
        self, *, base_url: str, paths: Sequence[str], methods: Sequence[str], headers: Sequence[str] = ()
    ) -> None:
        parts = urlsplit(base_url)
        self._scheme = parts.scheme.lower()
        self._netloc = parts.netloc.lower()
        self._base_path = parts.path.rstrip("/")
        self._base = f"{parts.scheme}://{parts.netloc}{self._base_path}"
        self._prefixes = tuple(sorted(paths, key=len, reverse=True))
        self.methods = frozenset(methods)
        self.headers = frozenset(name.lower() for name in headers)

    @classmethod
    def of(cls, upstream: UpstreamApi) -> UpstreamRule:
        return cls(base_url=upstream.base_url, paths=upstream.paths, methods=upstream.methods, headers=upstream.headers)

    @property
    def origin(self) -> tuple[str, str]:
        return self._scheme, self._netloc

    def resolve(self, method: str, raw_path: str, raw_query: str) -> Target:
        if method not in self.methods:
            raise Forbidden(f"method {method[:16]} is not declared for this connector's upstream")
        path = raw_path if raw_path.startswith("/") else "/" + raw_path
        self._check_raw(path, raw_query)
        template = self._allowed(unquote(path))
        url = self._base + path + (f"?{raw_query}" if raw_query else "")
        self._same_origin(url)
        return Target(url, template)

    def check_url(self, url: str) -> Target:
        """A URL the upstream named (a same-origin redirect): the same rules as a request path."""
        parts = urlsplit(url)
        if (parts.scheme.lower(), parts.netloc.lower()) != self.origin or parts.fragment:
            raise Forbidden("the upstream redirected to another origin; not followed")
        if not parts.path.startswith(self._base_path + "/") and parts.path != self._base_path:
            raise Forbidden("the upstream redirected outside the declared base path; not followed")
        rest = parts.path[len(self._base_path) :] or "/"
        self._check_raw(rest, parts.query)
        return Target(url, self._allowed(unquote(rest)))

    def _check_raw(self, path: str, query: str) -> None:
        if not _RAW_PATH.fullmatch(path):
            raise Forbidden("the path holds characters an upstream path may not ('@', '\\', spaces, ...)")
        if "//" in path or any(segment in (".", "..") for segment in path.split("/")):
            raise Forbidden("the path has '.', '..' or empty segments")
        for escape in _ESCAPE.findall(path):
            if int(escape, 16) in _BAD_ESCAPES:
                raise Forbidden("the path has an encoded '/', '\\', '.', '@', '%', '?' or control character")
        if path.count("%") != len(_ESCAPE.findall(path)):
            raise Forbidden("the path has a malformed percent-escape")
        if not _RAW_QUERY.fullmatch(query):
            raise Forbidden("the query holds characters a URL query may not")

    def _allowed(self, path: str) -> str:
        for prefix in self._prefixes:
            if path == prefix.rstrip("/") or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
                return prefix.rstrip("/") + "/*" if path != prefix.rstrip("/") else prefix
        raise Forbidden("the path is not under a prefix declared for this connector's upstream")

    def _same_origin(self, url: str) -> None:
        # SECURITY: the last word: whatever the checks above missed, the URL names the base's host.
        parts = urlsplit(url)
        if (parts.scheme.lower(), parts.netloc.lower()) != self.origin or parts.username or parts.fragment:
            raise Forbidden("the request would leave the declared upstream")
        if not (parts.path == self._base_path or parts.path.startswith(self._base_path + "/")):
            raise Forbidden("the request would leave the declared base path")
