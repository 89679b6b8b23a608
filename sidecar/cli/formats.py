"""MCP client configurations for each agent host, from one ``session new`` result (contract §2).

Each is what that host accepts as is: Claude Code (``.mcp.json`` / ``claude mcp add-json``), Cursor
(``~/.cursor/mcp.json``), VS Code (``.vscode/mcp.json``), and Claude Desktop, which speaks stdio
only and so reaches the daemon through ``npx mcp-remote`` with the secrets passed in ``env`` (its
``--header`` arguments may not contain spaces).

The entry is named ``sidecar`` for the bus at ``/mcp`` and ``sidecar-<id>`` for a connector's own route
(``session new --connector <id>``), so configurations for several connectors merge into one host file
without one replacing another.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from sidecar.names import CONNECTOR_ID

__all__ = ["ENV_REF_FORMATS", "FORMATS", "render", "render_env_refs", "server_name"]

SERVER_NAME: Final = "sidecar"
FORMATS: Final = ("raw", "claude-code", "cursor", "vscode", "claude-desktop")
_CONNECTOR_PATH: Final = "/mcp/connectors/"
ENV_REF_FORMATS: Final = ("claude-code",)
"""Hosts that expand ``${VAR}`` in their MCP config (Claude Code's ``.mcp.json`` does, in url and headers)."""


def server_name(url: str) -> str:
    """The host config's name for the route at ``url``: ``sidecar``, or ``sidecar-<id>`` for a connector's."""
    path = urlsplit(url).path
    connector_id = path.removeprefix(_CONNECTOR_PATH) if path.startswith(_CONNECTOR_PATH) else ""
    return f"{SERVER_NAME}-{connector_id}" if CONNECTOR_ID.fullmatch(connector_id) else SERVER_NAME


def render(fmt: str, session: dict[str, Any]) -> dict[str, Any]:
    """The configuration for host ``fmt``; ``session`` is the control API's ``POST /control/sessions`` answer."""
    url = session["url"]
    headers = dict(session["headers"])
    name = server_name(url)
    if fmt == "raw":
        return {k: session[k] for k in ("session_id", "url", "headers", "expires_at")}
    if fmt == "claude-code":
        return {"mcpServers": {name: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "cursor":
        return {"mcpServers": {name: {"url": url, "headers": headers}}}
    if fmt == "vscode":
        return {"servers": {name: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "claude-desktop":
        return {
            "mcpServers": {
                name: {
                    "command": "npx",
                    "args": [
                        "-y",
                        "mcp-remote",
                        url,
                        "--transport",
                        "http-only",
                        "--header",
                        "Authorization:${SIDECAR_AUTHORIZATION}",
                        "--header",
                        "X-Sidecar-Context:${SIDECAR_CONTEXT}",
                    ],
                    "env": {
                        "SIDECAR_AUTHORIZATION": headers["Authorization"],
                        "SIDECAR_CONTEXT": headers["X-Sidecar-Context"],
                    },
                }
            }
        }
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def render_env_refs(fmt: str, *, connector: str | None = None) -> dict[str, Any]:
    """A configuration that names ``sidecar exec``'s variables instead of holding secrets.

    It can be committed to a repository: the agent started with ``sidecar exec -- <agent>`` finds the
    daemon's origin, its route token and its session envelope in its environment, and the host expands
    them. No session is created for it.
    """
    if fmt not in ENV_REF_FORMATS:
        raise ValueError(f"--env-refs needs a host that expands ${{VAR}} in its config: {', '.join(ENV_REF_FORMATS)}")
    path = f"{_CONNECTOR_PATH}{connector}" if connector is not None else "/mcp"
    url = "${SIDECAR_LOCAL_MCP_ORIGIN}" + path
    headers = {"Authorization": "${SIDECAR_LOCAL_MCP_AUTHORIZATION}", "X-Sidecar-Context": "${SIDECAR_MCP_CONTEXT}"}
    return {"mcpServers": {server_name(path): {"type": "http", "url": url, "headers": headers}}}
