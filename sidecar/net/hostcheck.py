"""Pure request-guard checks (contract §3): the request target, ``Host``, ``Origin`` and ``Sec-Fetch-Site``.

Each check takes plain values (the raw request target, or every raw value of one header, as sent) and
either returns ``None`` or raises the matching ``sidecar.errors`` class. No aiohttp here: ``guard.py``
adapts these to a middleware. A message is shown to the client, so it says what is wrong with the value
and the remedy, never the value: a refused header may be a page's script, a control character or 4 KiB
of padding, and an answer that echoed it would hand it back to whoever sent it. The value itself
(``repr``, at most 100 characters, query string dropped) travels in the error's ``sent``, which only the
guard's log line shows.

The parsers are strict and hand-written on purpose: prefix matches and lenient URL parsers are how
loopback guards get bypassed (Jupyter GHSA-24qx-w28j-9m6p, the SDK's ``host:*`` rule, the ``user@host``
trick of ``urlsplit("//" + host)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from sidecar.errors import FetchSiteRejected, HostRejected, OriginRejected
from sidecar.origins import MAX_PORT, Origin, parse_origin, split_host_port
from sidecar.text import preview

__all__ = ["check_fetch_site", "check_host", "check_origin", "check_target"]

_SHOW_MAX: Final = 100
"""Longest rendering (characters) of a client-supplied value in a message or log line."""

_LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")
"""The only host names a client may put in ``Host`` (compared case-insensitively, with the port)."""

_HOST_CHARS: Final = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:[]")

_FETCH_SITE_FOREIGN: Final = frozenset({"cross-site", "same-site"})
"""The registered ``Sec-Fetch-Site`` values that name another site: an answer may name these two, being
constants rather than what the client wrote."""
_FETCH_SITE_ALLOWED: Final = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` values that pass. Anything else — ``cross-site``, ``same-site``, an unknown or empty
value — is refused: deny by default, as Go's ``CrossOriginProtection`` does."""


# --- Host ------------------------------------------------------------------------------------------


def check_host(values: Sequence[str], *, port: int) -> None:
    """Accept exactly one ``Host`` value equal to ``127.0.0.1:<port>``, ``localhost:<port>`` or
    ``[::1]:<port>`` (ASCII case-insensitive), where ``port`` is the listening port; else ``HostRejected``.

    ``values`` are all raw ``Host`` header values of the request. ``ValueError`` if ``port`` is not a
    TCP port (a programming error, never the client's).
    """
    if not 0 < port <= MAX_PORT:
        raise ValueError(f"listening port out of range: {port}")
    remedy = f"connect to http://127.0.0.1:{port}/ (Host must be 127.0.0.1:{port}, localhost:{port} or [::1]:{port})"
    if not values:
        # SECURITY: aiohttp accepts an HTTP/1.0 request without Host and request.host then falls back
        # to the socket address, so "absent" must be refused here.
        raise HostRejected(f"missing Host header; {remedy}")
    if len(values) > 1:
        raise HostRejected(f"{len(values)} Host headers; send exactly one; {remedy}", sent=_shown(values))
    value = values[0]
    # SECURITY: acceptance is exact equality with one of three strings, nothing else. isascii() first,
    # because str.lower() maps some non-ASCII letters onto ASCII ones (e.g. KELVIN SIGN -> "k").
    if value.isascii() and value.lower() in {f"{name}:{port}" for name in _LOOPBACK_NAMES}:
        return
    # SECURITY: the answer names the problem, not the value (issue 11 item 3).
    raise HostRejected(f"Host refused: {_host_problem(value, port)}; {remedy}", sent=_shown(value))


def _host_problem(value: str, port: int) -> str:
    """Say why ``value`` is not an accepted Host. Only picks the message: acceptance is decided above."""
    if not value:
        return "empty"
    if not value.isascii() or not set(value) <= _HOST_CHARS:
        return "characters outside a loopback host:port (userinfo, space, comma, path...)"
    name, port_text = split_host_port(value)
    if name.lower() not in _LOOPBACK_NAMES:
        return "not a loopback name"
    if port_text is None:
        return "no port"
    if port_text != str(port):
        return "wrong port"
    return "not an accepted form"


# --- Origin ----------------------------------------------------------------------------------------


def check_origin(values: Sequence[str], *, allowed: frozenset[Origin]) -> None:
    """Accept a request with no ``Origin``, or exactly one whose (scheme, host, port) is in ``allowed``.

    ``allowed`` holds tuples as made by ``sidecar.origins.parse_origin``, the parser applied to the header
    here too (lower-case host, IPv6 without brackets, default port filled in). More than one value,
    ``null``, empty, unparsable, or any origin not exactly in ``allowed`` raises ``OriginRejected``. Never
    raises anything else, whatever the input.
    """
    if not values:
        return  # CLI and SDK clients send no Origin; browsers always do on the requests that matter.
    remedy = "add it to allowed_origins (scheme://host[:port]) if this web page may call sidecar"
    if len(values) > 1:
        raise OriginRejected(f"{len(values)} Origin headers; a browser sends exactly one", sent=_shown(values))
    value = values[0]
    if value.strip().lower() == "null":
        # SECURITY: "null" is the opaque origin of sandboxed frames, file:// pages and cross-origin
        # redirects: it identifies no one, so it can never be allowed.
        raise OriginRejected("Origin null (an opaque origin) is never allowed", sent=_shown(value))
    try:
        origin = parse_origin(value)
    except ValueError:
        raise OriginRejected("Origin is not scheme://host[:port]", sent=_shown(value)) from None
    # SECURITY: exact tuple match; never a prefix, suffix or pattern match.
    if origin not in allowed:
        raise OriginRejected(f"Origin is not allowed; {remedy}", sent=_shown(value))


# --- Sec-Fetch-Site and the request target ---------------------------------------------------------


def check_fetch_site(values: Sequence[str]) -> None:
    """Accept a request with no ``Sec-Fetch-Site``, or whose every value is ``same-origin`` or ``none``.

    ``cross-site`` and ``same-site`` (any case, in any of several values or comma-joined) raise
    ``FetchSiteRejected``, and so do unknown or empty values: a browser only ever sends the four
    registered ones (W3C Fetch Metadata §2.1).
    """
    for value in values:
        for item in value.split(","):
            token = item.strip().lower()
            if token not in _FETCH_SITE_ALLOWED:
                # SECURITY: a second CSRF signal beside Origin: browser no-cors GETs (<script>, <img>)
                # carry no Origin, but they do carry Sec-Fetch-Site.
                what = f"Sec-Fetch-Site {token}" if token in _FETCH_SITE_FOREIGN else "an unknown Sec-Fetch-Site value"
                raise FetchSiteRejected(
                    f"{what} refused: sidecar serves no other site's pages; "
                    "call it from a local client, not from a web page",
                    sent=_shown(item.strip()),
                )


def check_target(raw_target: str) -> None:
    """Accept only an origin-form request target (``/path?query``, RFC 9112 §3.2.1); else ``HostRejected``.

    Absolute-form (``http://evil/x``), authority-form (``CONNECT host:443``), asterisk-form (``*``) and
    network-path targets (``//evil/x``) are refused: each names a host other than the checked ``Host``.
    """
    # SECURITY: aiohttp takes request.host and request.url from an absolute-form target, not from the
    # Host header, so a target naming any authority would get past a Host-only check.
    if raw_target.startswith("/") and not raw_target.startswith("//"):
        return
    shown = raw_target.partition("?")[0].partition("#")[0]  # the query may carry an OAuth code
    raise HostRejected(
        f"{_target_form(raw_target)} request target refused: send the path only (origin-form, e.g. GET /mcp), "
        "with the host in the Host header",
        sent=_shown(shown),
    )


def _target_form(raw_target: str) -> str:
    """Which form of RFC 9112 §3.2 a refused target has, in words (never the target itself)."""
    if raw_target.startswith("//"):
        return "a network-path"
    if raw_target == "*":
        return "an asterisk-form"
    if "://" in raw_target:
        return "an absolute-form"
    return "a non-origin-form"


def _shown(value: str | Sequence[str]) -> str:
    """A refused value as the log line shows it: repr-escaped and at most ``_SHOW_MAX`` characters."""
    return preview(value if isinstance(value, str) else list(value), _SHOW_MAX)
