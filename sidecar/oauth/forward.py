"""The internal API's upstream hop: the real access token attached, the answer bounded and stripped.

``Forwarder.forward`` sends one checked request (``target.UpstreamRule`` has already refused every
escape) to the connector's upstream with ``Authorization: Bearer <access token>`` from the connector's
``GrantKeeper`` (refreshed first when due; single flight, so twenty concurrent calls during a rotation
make one refresh). Then:

- **401** from upstream: one refresh (or the token another caller refreshed meanwhile) and one retry;
  a second 401, or a grant that cannot be refreshed, is ``NeedsAuthorization`` (the edge answers 401
  ``unauthorized``);
- **redirects** are never followed blindly: one to the same origin, under the base path, to an allowed
  prefix is followed (at most ``MAX_REDIRECTS``); any other is refused (``Forbidden``) before anything
  is sent there, so the token never reaches another origin;
- the answer is read to at most ``max_bytes`` (else ``UpstreamFailed``), within ``timeout`` seconds;
- only an allowlist of response headers comes back: never ``Set-Cookie``, ``Authorization``,
  ``WWW-Authenticate`` or anything else credential-like. No cookie jar: nothing upstream sets is kept.

The request's own headers are an allowlist too: content negotiation, conditionals, and the ``X-``
headers the package declares in ``upstream.headers`` (never sidecar's own, ``X-Forwarded-*``, or one
that makes a server act on another method or path: ``X-HTTP-Method-Override``, ``X-Method-Override``,
``X-Original-URL``, ``X-Rewrite-URL``); nothing named in ``Connection`` goes on. The connector can send
no ``Authorization``, ``Cookie`` or ``Host`` of its own, and no header can step outside its declared
methods and paths.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urljoin

import aiohttp

from sidecar.errors import UpstreamFailed
from sidecar.oauth.grant import NeedsAuthorization
from sidecar.oauth.target import Target, UpstreamRule

__all__ = [
    "FORBIDDEN_HEADERS",
    "FORBIDDEN_HEADER_PREFIXES",
    "MAX_RESPONSE_BYTES",
    "UPSTREAM_TIMEOUT",
    "Forwarder",
    "TokenSource",
    "UpstreamFailed",
    "UpstreamResponse",
]

logger = logging.getLogger(__name__)

UPSTREAM_TIMEOUT: Final = 60.0
"""Seconds one upstream request may take, connect to last byte (redirect hops and the retry each get their own)."""
CONNECT_TIMEOUT: Final = 10.0
MAX_RESPONSE_BYTES: Final = 8 * 1024 * 1024
"""The largest upstream answer passed back (decompressed); an API page is far smaller."""
MAX_REDIRECTS: Final = 3
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_REQUEST_HEADERS: Final = frozenset(
    {
        "accept",
        "accept-language",
        "content-type",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
    }
)
FORBIDDEN_HEADERS: Final = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override", "x-original-url", "x-rewrite-url"}
)
"""Headers some servers and proxies obey as another method or path: never forwarded, never declarable."""
FORBIDDEN_HEADER_PREFIXES: Final = ("x-sidecar", "x-forwarded")
_RESPONSE_HEADERS: Final = frozenset(
    {
        "content-type",
        "content-language",
        "cache-control",
        "etag",
        "last-modified",
        "link",
        "retry-after",
        "date",
        "vary",
    }
)
_RESPONSE_PREFIXES: Final = ("x-ratelimit-", "ratelimit")


class TokenSource(Protocol):
    """What the forwarder needs of a grant (``grant.GrantKeeper``; tests swap it)."""

    connector_id: str

    async def access_token(self) -> str | None: ...

    async def rejected(self, token: str | None) -> str: ...


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    """What the upstream API answered, bounded and stripped (``response_headers``), to pass back as is."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def request_headers(headers: Mapping[str, str], declared: frozenset[str] = frozenset()) -> dict[str, str]:
    """The connector's headers that may go upstream: the standard few and the ``declared`` ``X-`` ones.

    Whatever ``Connection`` names is hop-by-hop and stays here; the forbidden ones never pass, declared
    or not (the manifest refuses them too).
    """
    hop = {part.strip().lower() for value in _all(headers, "connection") for part in value.split(",")}
    kept: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in hop or lower in FORBIDDEN_HEADERS or lower.startswith(FORBIDDEN_HEADER_PREFIXES):
            continue
        if lower in _REQUEST_HEADERS or lower in declared:
            kept[name] = value
    return kept


def _all(headers: Mapping[str, str], name: str) -> list[str]:
    getall = getattr(headers, "getall", None)  # a multidict (the request's) may hold a header twice
    if callable(getall):
        return [str(v) for v in getall(name, [])]
    return [v for k, v in headers.items() if k.lower() == name]


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's headers that may come back (allowlist: nothing credential-like)."""
    return {
        name: value
        for name, value in headers.items()
        if name.lower() in _RESPONSE_HEADERS or name.lower().startswith(_RESPONSE_PREFIXES)
    }


class Forwarder:
    """One HTTP client for every connector's upstream (pooled connections; no cookies kept)."""

    def __init__(self, *, timeout: float = UPSTREAM_TIMEOUT, max_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=CONNECT_TIMEOUT)
        self._max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # SECURITY: no cookie jar: a cookie one upstream sets must never ride along to another call.
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(
        self,
        keeper: TokenSource,
        rule: UpstreamRule,
        target: Target,
        *,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> UpstreamResponse:
        token = await keeper.access_token()
        if token is None:
            raise NeedsAuthorization(keeper.connector_id)
        sent = request_headers(headers, rule.headers)
        answer, _ = await self._follow(rule, target, method, sent, body, token)
        if answer.status == 401:
            token = await keeper.rejected(token)  # NeedsAuthorization when no refresh helps
            answer, _ = await self._follow(rule, target, method, sent, body, token)
            if answer.status == 401:
                raise NeedsAuthorization(keeper.connector_id)
        return answer

    async def _follow(
        self, rule: UpstreamRule, target: Target, method: str, headers: dict[str, str], body: bytes, token: str
    ) -> tuple[UpstreamResponse, Target]:
        for _ in range(MAX_REDIRECTS + 1):
            answer, location = await self._send(method, target.url, headers, body, token)
            if answer.status not in _REDIRECTS or location is None:
                return answer, target
            target = rule.check_url(urljoin(target.url, location))  # Forbidden: never sent elsewhere
            if answer.status == 303 or (answer.status in (301, 302) and method == "POST"):
                method, body = "GET", b""
            if method not in rule.methods:
                raise UpstreamFailed(f"the upstream redirected to a {method} this connector may not make")
        raise UpstreamFailed(f"the upstream redirected more than {MAX_REDIRECTS} times")

    async def _send(
        self, method: str, url: str, headers: dict[str, str], body: bytes, token: str
    ) -> tuple[UpstreamResponse, str | None]:
        outgoing = {**headers, "Authorization": f"Bearer {token}"}
        try:
            async with self._http().request(
                method, url, headers=outgoing, data=body or None, allow_redirects=False
            ) as response:
                data = await self._read(response)
                location = response.headers.get("Location")
                return UpstreamResponse(response.status, response_headers(response.headers), data), location
        except TimeoutError:
            raise UpstreamFailed("the upstream did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailed(f"the upstream is unreachable ({type(exc).__name__})") from None

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        declared = response.content_length
        if declared is not None and declared > self._max_bytes:
            raise UpstreamFailed(f"the upstream answer is larger than {self._max_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > self._max_bytes:
                raise UpstreamFailed(f"the upstream answer is larger than {self._max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
