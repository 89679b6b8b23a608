"""A Streamable-HTTP MCP server that needs OAuth: the SDK's ``MCPServer`` checking tokens by introspection.

``python -m tests.oauth.resource_server PORT ISSUER``: serves ``http://127.0.0.1:PORT/mcp``, advertises
ISSUER in its protected resource metadata (RFC 9728), and asks ISSUER's RFC 7662 introspection endpoint
(as the confidential client ``rs``) about every bearer token. Tool ``echo`` returns its text; tool
``admin_echo`` does too, but only for a token with the ``admin`` scope: without it the call is answered
``403`` with an RFC 6750 ``insufficient_scope`` challenge naming ``mcp admin`` (the MCP spec's step-up).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

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


STEP_UP_TOOL = "admin_echo"
STEP_UP_SCOPE = "mcp admin"


class StepUp:
    """ASGI middleware: a ``tools/call`` of ``admin_echo`` without the ``admin`` scope gets 403."""

    def __init__(self, app: Any, introspection: Introspection, metadata_url: str) -> None:
        self._app = app
        self._introspection = introspection
        self._metadata_url = metadata_url

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if await self._refused(scope, body):
            challenge = (
                f'Bearer error="insufficient_scope", scope="{STEP_UP_SCOPE}", resource_metadata="{self._metadata_url}"'
            )
            headers = [(b"www-authenticate", challenge.encode()), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, send)

    async def _refused(self, scope: dict[str, Any], body: bytes) -> bool:
        try:
            message = json.loads(body)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            return False
        if (message.get("params") or {}).get("name") != STEP_UP_TOOL:
            return False
        header = dict(scope["headers"]).get(b"authorization", b"").decode()
        token = await self._introspection.verify_token(header.removeprefix("Bearer "))
        return token is None or "admin" not in token.scopes


def main() -> None:
    port, issuer = int(sys.argv[1]), sys.argv[2]
    resource = f"http://127.0.0.1:{port}/mcp"
    server = MCPServer(
        "oauth-echo",
        token_verifier=Introspection(issuer, resource),  # its own: the middleware's is not the server's
        auth=AuthSettings(issuer_url=issuer, resource_server_url=resource, required_scopes=["mcp"]),
    )

    @server.tool()
    def echo(text: str) -> str:
        """Return the text."""
        return text

    @server.tool()
    def admin_echo(text: str) -> str:
        """Return the text (needs the ``admin`` scope)."""
        return text

    introspection = Introspection(issuer, resource)
    metadata_url = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"
    app = StepUp(server.streamable_http_app(host="127.0.0.1"), introspection, metadata_url)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
