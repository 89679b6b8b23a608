"""Names spelled in many places: route names, connector tool names, the tool-name pattern.

Pure and dependency-free, so every layer can use the same spelling. A connector ``<id>`` lends its
name to three things: its route ``connector:<id>`` (token and path ``/mcp/connectors/<id>``), its tools
``mcp__<id>__<tool>`` and the grant pattern ``mcp__<id>__*`` that covers all of them. Connector ids have
no ``__`` and no ``_`` at either end, so ``mcp__<id>__<tool>`` splits one way only.

A session's grant is a list of patterns (``is_grant_pattern``): ``*`` (every tool), ``builtin:*`` (every
built-in tool), ``mcp__<id>__*`` (every tool of one connector) or an exact tool name.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "BUILTIN_GRANT",
    "CONNECTOR_ID",
    "MAX_TOOL_NAME",
    "PROXY_ROUTE",
    "TOOL_NAME",
    "connector_grant",
    "connector_of_route",
    "connector_route",
    "connector_tool",
    "is_connector_grant",
    "is_grant_pattern",
    "is_mcp_endpoint",
    "refusal_route",
    "split_connector_tool",
]

MAX_TOOL_NAME: Final = 64
"""Longest tool name, whole (``mcp__<id>__<tool>`` included): what hosts and model APIs accept."""
TOOL_NAME: Final = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TOOL_NAME}}}")
"""Every tool name, built-in or connector (use ``fullmatch``)."""

CONNECTOR_ID: Final = re.compile(r"[a-z0-9][a-z0-9-]*(?:_[a-z0-9-]+)*")
"""A connector id (use ``fullmatch``): lower-case, no ``__`` and no ``_`` at either end, so that
``mcp__<id>__<tool>`` splits one way only."""

PROXY_ROUTE: Final = "connector-proxy"
"""The aggregated bus at ``/mcp`` (and the REST facade under ``/api/v1/``)."""

BUILTIN_GRANT: Final = "builtin:*"
"""The grant pattern that covers every built-in tool and no connector's: what a session gets by default.
Not a tool name (``:`` and ``*`` are not in ``TOOL_NAME``), so it can never mean one."""

_ROUTE_PREFIX: Final = "connector:"
_TOOL_PREFIX: Final = "mcp__"
_SEPARATOR: Final = "__"


def connector_route(connector_id: str) -> str:
    """The route of a connector's own endpoint, ``/mcp/connectors/<id>``."""
    return f"{_ROUTE_PREFIX}{connector_id}"


def connector_of_route(route: str) -> str | None:
    """The connector whose own route this is; None for the bus or any other route."""
    if route.startswith(_ROUTE_PREFIX) and len(route) > len(_ROUTE_PREFIX):
        return route[len(_ROUTE_PREFIX) :]
    return None


def connector_tool(connector_id: str, tool: str) -> str:
    """A connector's tool (or prompt) as the pool names it."""
    return f"{_TOOL_PREFIX}{connector_id}{_SEPARATOR}{tool}"


def connector_grant(connector_id: str) -> str:
    """The grant pattern that covers every tool of one connector."""
    return connector_tool(connector_id, "*")


def split_connector_tool(name: str) -> tuple[str, str] | None:
    """``mcp__<id>__<tool>`` → (id, tool); None when ``name`` is not a connector tool's name."""
    if not name.startswith(_TOOL_PREFIX):
        return None
    connector_id, sep, tool = name[len(_TOOL_PREFIX) :].partition(_SEPARATOR)
    if not sep or not connector_id or not tool:
        return None
    return connector_id, tool


def is_connector_grant(pattern: str) -> bool:
    """Whether ``pattern`` is ``mcp__<id>__*`` for a well-formed connector id."""
    parts = split_connector_tool(pattern)
    return parts is not None and parts[1] == "*" and CONNECTOR_ID.fullmatch(parts[0]) is not None


def is_grant_pattern(pattern: str) -> bool:
    """Whether ``pattern`` may stand in a session's grant: ``*``, ``builtin:*``, ``mcp__<id>__*`` or a tool name."""
    return pattern in ("*", BUILTIN_GRANT) or TOOL_NAME.fullmatch(pattern) is not None or is_connector_grant(pattern)


def is_mcp_endpoint(path: str) -> bool:
    """Whether ``path`` is an MCP endpoint a client talks to: ``/mcp`` or ``/mcp/connectors/<id>``."""
    if path == "/mcp":
        return True
    connector = path.removeprefix("/mcp/connectors/")
    return connector != path and CONNECTOR_ID.fullmatch(connector) is not None


_REFUSAL_ROUTES: Final = (
    ("/mcp/connectors/", "relay"),
    ("/mcp/internal/", "internal"),
    ("/mcp", "mcp"),
    ("/api/", "rest"),
    ("/control", "control"),
    ("/ui", "console"),
    ("/oauth/", "oauth"),
)


def refusal_route(path: str) -> str:
    """Which family of routes ``path`` belongs to, as the aggregate refusal records name it (never the
    path itself, which a caller chose): ``mcp``, ``relay``, ``internal``, ``rest``, ``control``,
    ``console``, ``oauth`` or ``other``."""
    for prefix, name in _REFUSAL_ROUTES:
        if path.startswith(prefix):
            return name
    return "other"
