"""The network guard middleware (contract §3): a thin aiohttp adapter over the checks in ``hostcheck``.

It must run before anything else looks at the request, and it reads only what the client actually
sent: ``request.raw_path`` (the request target verbatim, as the C and pure-Python parsers keep it in
``RawRequestMessage.path``) and ``request.headers.getall(...)``. It never uses ``request.host`` or
``request.url``: for an absolute-form target both come from the target, not from ``Host``, and with no
``Host`` at all ``request.host`` falls back to the socket address (verified with aiohttp 3.14.5).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict

from sidecar.errors import SidecarError
from sidecar.http import error_response
from sidecar.names import refusal_route
from sidecar.net.hostcheck import check_fetch_site, check_host, check_origin, check_target
from sidecar.origins import Origin
from sidecar.text import preview

__all__ = ["Refused", "add_vary_origin", "make_guard_middleware", "own_origins"]

logger = logging.getLogger(__name__)

Refused = Callable[[str, str], bool]
"""Counts one refusal before any credential is known, as (route family, reason): the audit gets one
record per route a minute (``store.tally``). True for the first of its kind in the window: worth a log line."""

_SEC_FETCH_SITE = "Sec-Fetch-Site"


def make_guard_middleware(
    *,
    port: Callable[[], int],
    allowed_origins: frozenset[Origin],
    fetch_site_exempt: Callable[[str], bool] = lambda path: False,
    own_origin_paths: Callable[[str], bool] = lambda path: False,
    refused: Refused = lambda route, reason: True,
) -> Middleware:
    """Build the guard: target → Host → Origin → Sec-Fetch-Site, first failure answers, handler untouched.

    ``port`` returns the listening port (known only after bind; it is called per request).
    ``allowed_origins`` are exact (scheme, host, port) tuples. ``fetch_site_exempt(path)`` is true for the
    few paths a cross-site browser navigation must reach (the OAuth callback page); it relaxes only the
    ``Sec-Fetch-Site`` check, never Host or Origin. ``own_origin_paths(path)`` is true for the paths the
    daemon's own pages call (the web console, ``/ui``): there the daemon's own origins
    (``http://127.0.0.1:<port>``, ``localhost``, ``[::1]``) pass too, and nowhere else. A refusal is a
    JSON error from ``error_response`` that says what is wrong; ``refused`` counts it, and the first of its
    route and reason in a minute gets one WARNING line that also names the offending value (a flood writes
    no line per request). No CORS header is ever added; ``add_vary_origin`` (an ``on_response_prepare`` hook)
    marks every response as varying on ``Origin``.
    """

    @web.middleware
    async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            _check_request(
                request,
                port=port(),
                allowed_origins=allowed_origins,
                exempt=fetch_site_exempt,
                own_origin=own_origin_paths,
            )
        except SidecarError as err:
            # One line with the offending value (repr'd and cut by hostcheck, in ``sent``: the answer
            # itself never carries it); other headers and query strings are never logged.
            if refused(refusal_route(request.path), err.code):  # the first of its kind this minute: one line
                sent = f" (sent: {err.sent})" if err.sent is not None else ""
                logger.warning("guard refused %s %s: %s%s", request.method, preview(request.path), err, sent)
            return error_response(request.path, err)
        return await handler(request)

    return guard_middleware


def own_origins(port: int) -> frozenset[Origin]:
    """The daemon's own origins: its pages as a browser reaches them by any of the three loopback names."""
    return frozenset({("http", "127.0.0.1", port), ("http", "localhost", port), ("http", "::1", port)})


def _check_request(
    request: web.Request,
    *,
    port: int,
    allowed_origins: frozenset[Origin],
    exempt: Callable[[str], bool],
    own_origin: Callable[[str], bool],
) -> None:
    """Run the four checks in order on the raw target and raw header values."""
    # SECURITY: raw_path is the verbatim request target; request.path/url/host are derived from an
    # absolute-form target and would hide "GET http://evil/x".
    check_target(request.raw_path)
    # SECURITY: every raw Host value, never request.host (socket-address fallback when Host is absent).
    check_host(request.headers.getall(hdrs.HOST, []), port=port)
    # SECURITY: Origin is checked even on requests that carry a valid bearer token (unlike Jupyter). The
    # daemon's own origin passes only on the paths ``own_origin`` names: the console (which then wants its
    # cookie, its CSRF token and that very origin for every change) and the MCP endpoints (which want a
    # route token and an envelope anyway); never on /control, the REST facade or the internal API.
    allowed = allowed_origins | own_origins(port) if own_origin(request.path) else allowed_origins
    check_origin(request.headers.getall(hdrs.ORIGIN, []), allowed=allowed)
    # The target is origin-form by now, so request.path is the path the router will match.
    if not exempt(request.path):
        check_fetch_site(request.headers.getall(_SEC_FETCH_SITE, []))


async def add_vary_origin(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: every response, streamed ones too, varies on ``Origin``."""
    _add_vary_origin(response.headers)


def _add_vary_origin(headers: CIMultiDict[str]) -> None:
    """Add ``Origin`` to ``Vary``: the answer depends on it (MCP security best practices checklist)."""
    current = headers.get(hdrs.VARY)
    if current is None:
        headers[hdrs.VARY] = "Origin"
        return
    tokens = {token.strip().lower() for token in current.split(",")}
    if "origin" not in tokens and "*" not in tokens:
        headers[hdrs.VARY] = f"{current}, Origin"
