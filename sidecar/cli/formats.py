"""MCP client configurations for each agent host, from one ``session new`` result (contract §2).

Each is what that host accepts as is: Claude Code (``.mcp.json`` / ``claude mcp add-json``), Cursor
(``~/.cursor/mcp.json``), VS Code (``.vscode/mcp.json``), and Claude Desktop, which speaks stdio
only and so reaches the daemon through ``npx mcp-remote`` with the secrets passed in ``env`` (its
``--header`` arguments may not contain spaces).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "render"]

SERVER_NAME = "sidecar"
FORMATS = ("raw", "claude-code", "cursor", "vscode", "claude-desktop")


def render(fmt: str, session: dict[str, Any]) -> dict[str, Any]:
    """The configuration for host ``fmt``; ``session`` is the control API's ``POST /control/sessions`` answer."""
    url = session["url"]
    headers = dict(session["headers"])
    if fmt == "raw":
        return {k: session[k] for k in ("session_id", "url", "headers", "expires_at")}
    if fmt == "claude-code":
        return {"mcpServers": {SERVER_NAME: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "cursor":
        return {"mcpServers": {SERVER_NAME: {"url": url, "headers": headers}}}
    if fmt == "vscode":
        return {"servers": {SERVER_NAME: {"type": "http", "url": url, "headers": headers}}}
    if fmt == "claude-desktop":
        return {
            "mcpServers": {
                SERVER_NAME: {
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
