"""A Streamable-HTTP MCP server that needs OAuth: the SDK's ``MCPServer`` checking tokens by introspection.

``python -m tests.oauth.resource_server PORT ISSUER``: serves ``http://127.0.0.1:PORT/mcp``, advertises
ISSUER in its protected resource metadata (RFC 9728), and asks ISSUER's RFC 7662 introspection endpoint
(as the confidential client ``rs``) about every bearer token. Tool ``echo`` returns its text.
"""

from __future__ import annotations

import sys
import time

import httpx2
import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer


class Introspection:
    def __init__(self, issuer: str, resource: str) -> None:
        self._endpoint = f"{issuer}/token/introspection"
        self._resource = resource

    async def verify_token(self, token: str) -> AccessToken | None:
        async with httpx2.AsyncClient(timeout=10) as http:
            answer = await http.post(self._endpoint, data={"token": token}, auth=("rs", "rs-secret"))
        data = answer.json() if answer.status_code == 200 else {}
        if not data.get("active") or (data.get("exp") and data["exp"] < time.time()):
            return None
        return AccessToken(
            token=token,
            client_id=str(data.get("client_id", "")),
            scopes=str(data.get("scope", "")).split(),
            expires_at=data.get("exp"),
            resource=self._resource,
        )


def main() -> None:
    port, issuer = int(sys.argv[1]), sys.argv[2]
    resource = f"http://127.0.0.1:{port}/mcp"
    server = MCPServer(
        "oauth-echo",
        token_verifier=Introspection(issuer, resource),
        auth=AuthSettings(issuer_url=issuer, resource_server_url=resource, required_scopes=["mcp"]),
    )

    @server.tool()
    def echo(text: str) -> str:
        """Return the text."""
        return text

    uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
