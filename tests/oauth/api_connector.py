"""A connector package's server for the internal API tests: it reaches its upstream only through sidecar.

stdio MCP server. Its ``mcp.json`` passes ``API_BASE`` (``${SIDECAR_LOCAL_MCP_ORIGIN}/mcp/internal/<id>/api``),
``API_AUTHORIZATION`` (``${SIDECAR_LOCAL_MCP_AUTHORIZATION}``) and ``API_CONTEXT`` (``${SIDECAR_MCP_CONTEXT}``).
Tool ``fetch(path, method)`` answers ``<status> <body>``, or, on 401, says in plain words that the
connector is not authorized.
"""

from __future__ import annotations

import os

import httpx2
from mcp.server.mcpserver import MCPServer

server = MCPServer("api-connector")


@server.tool()
async def fetch(path: str, method: str = "GET") -> str:
    """Call the upstream API through sidecar's internal API."""
    headers = {"Authorization": os.environ["API_AUTHORIZATION"], "X-Sidecar-Context": os.environ["API_CONTEXT"]}
    async with httpx2.AsyncClient(timeout=60) as http:
        answer = await http.request(method, os.environ["API_BASE"] + path, headers=headers)
    if answer.status_code == 401:
        return "unauthorized: sidecar has no usable sign-in for this connector; run sidecar connectors connect"
    return f"{answer.status_code} {answer.text}"


if __name__ == "__main__":
    server.run()
