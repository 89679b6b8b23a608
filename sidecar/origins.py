"""Web origins as the guard compares them: one strict parser for configured and presented origins.

An origin is the tuple ``(scheme, host, port)`` of RFC 6454: lower-case scheme and host, an IPv6 host
without its brackets, and the scheme's default port filled in. The same parser reads the user's
``allowed_origins`` setting and the ``Origin`` header a browser sends, so a configured origin matches
exactly the headers that spell it, and a setting no browser could ever send is refused when it is read.

The parser is hand-written on purpose: ``urlsplit`` drops tabs and newlines, accepts userinfo
(``http://user@host``) and empty ports, and lenient parsers are how loopback guards get bypassed.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from sidecar.text import preview

__all__ = ["MAX_PORT", "Origin", "is_loopback_host", "parse_origin", "split_host_port"]

Origin = tuple[str, str, int]
"""An origin as compared by the guard: (scheme, lower-case host, port with the default filled in)."""

MAX_PORT: Final = 65535

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_REG_NAME_CHARS: Final = frozenset("0123456789abcdefghijklmnopqrstuvwxyz.-_~")
_IPV6_CHARS: Final = frozenset("0123456789abcdef:.")
_DIGITS: Final = frozenset("0123456789")


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback IP literal (no brackets): where plain ``http`` may go without leaving the
    machine. Any other name could resolve anywhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_origin(text: str) -> Origin:
    """Parse an RFC 6454 serialised origin ``scheme "://" host [ ":" port ]``; ``ValueError`` if it is not one.

    Only ASCII, only ``http``/``https``, a reg-name of unreserved characters or a bracketed IPv6 literal,
    and a port of 1-5 digits without a leading zero. Path, query, fragment and userinfo make it unparsable.
    The message quotes ``text`` (bounded, escaped) and says what an origin looks like.
    """
    origin = _parse(text)
    if origin is None:
        raise ValueError(
            f"not an origin: {preview(text)}; want http(s)://host[:port] with a host name or a [IPv6] address, "
            "a port 1-65535 without leading zeros, and no path, query, fragment or user"
        )
    return origin


def split_host_port(value: str) -> tuple[str, str | None]:
    """Split ``name[:port]`` or ``[v6][:port]`` without any URL parser; the port is ``None`` if absent."""
    if value.startswith("["):
        end = value.find("]")
        if end == -1:
            return value, None
        name, rest = value[: end + 1], value[end + 1 :]
        return (name, rest[1:]) if rest.startswith(":") else (value if rest else name, None)
    name, sep, port_text = value.partition(":")
    return (name, port_text) if sep else (name, None)


def _parse(text: str) -> Origin | None:
    if not text.isascii():
        return None
    scheme, sep, authority = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        return None
    host, port_text = split_host_port(authority)
    host = host.lower()
    if host.startswith("[") and host.endswith("]") and len(host) > 2 and set(host[1:-1]) <= _IPV6_CHARS:
        host = host[1:-1]  # an IPv6 host is kept without brackets
    elif not host or not set(host) <= _REG_NAME_CHARS:
        return None
    if port_text is None:
        return (scheme, host, _DEFAULT_PORTS[scheme])
    port = _parse_port(port_text)
    return None if port is None else (scheme, host, port)


def _parse_port(text: str) -> int | None:
    """1-5 ASCII digits, no leading zero, 1..65535; else ``None`` (``int()`` alone takes ``+1``, ``1_0``)."""
    if not 0 < len(text) <= 5 or not set(text) <= _DIGITS or text.startswith("0"):
        return None
    port = int(text)
    return port if port <= MAX_PORT else None
