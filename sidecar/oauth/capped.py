"""Token responses are read up to a bound: a token endpoint cannot make the daemon hold or store a
megabyte "token".

``TokenCap`` wraps the transport of every HTTP client that talks to an authorization server (the SDK's
provider during a remote sign-in, a package's sign-in, every refresh). A response to a token request
(a ``POST`` whose form carries ``grant_type``) longer than ``MAX_TOKEN_RESPONSE`` bytes fails while it
is read, as an ``httpx2.TransportError`` (``TokenResponseTooLarge``), so every caller's handling of an
unreachable token endpoint applies and nothing is stored. Token requests ask for no content coding (the
bound is on what is decoded: a compressed answer is refused). Other responses pass untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import httpx2

__all__ = ["MAX_TOKEN_RESPONSE", "TokenCap", "TokenResponseTooLarge", "token_endpoint_failure"]

MAX_TOKEN_RESPONSE: Final = 64 * 1024
"""Bytes a token response may have: a token set with an id_token is a few KiB."""


class TokenResponseTooLarge(httpx2.TransportError):
    """The token endpoint answered with more than ``MAX_TOKEN_RESPONSE`` bytes."""


class TokenCap(httpx2.AsyncBaseTransport):
    """A transport that bounds token responses and passes everything else to ``inner``."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None, *, limit: int = MAX_TOKEN_RESPONSE) -> None:
        self._inner = inner if inner is not None else httpx2.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not _is_token_request(request):
            return await self._inner.handle_async_request(request)
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        coded = response.headers.get("content-encoding", "identity").lower() != "identity"
        if (
            coded
            or (declared.isdigit() and int(declared) > self._limit)
            or not isinstance(response.stream, httpx2.AsyncByteStream)
        ):
            await response.aclose()
            raise TokenResponseTooLarge(_too_large(self._limit), request=request)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Bounded(response.stream, self._limit, request),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Bounded(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, limit: int, request: httpx2.Request) -> None:
        self._stream = stream
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise TokenResponseTooLarge(_too_large(self._limit), request=self._request)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def _is_token_request(request: httpx2.Request) -> bool:
    if request.method != "POST" or not request.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        return False
    return b"grant_type=" in request.content


def _too_large(limit: int) -> str:
    return f"the token endpoint's answer is larger than {limit} bytes, or compressed; nothing of it is kept"


def token_endpoint_failure(exc: httpx2.HTTPError) -> str:
    """What to say when a token request failed on the way: too large, or unreachable."""
    if isinstance(exc, TokenResponseTooLarge):
        return str(exc)
    return f"the token endpoint is unreachable ({type(exc).__name__})"
