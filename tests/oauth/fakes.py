"""An in-memory MCP resource server and authorization server (``httpx2.MockTransport``), and a store.

Unit tests only: the real-AS tests (a rotating-refresh AS in a subprocess) come with the daemon wiring.
The AS serves its token endpoint at ``/oauth/token``, not the SDK's fallback ``/token``, so a request
that reaches the right endpoint proves the discovered metadata was used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import httpx2

from sidecar.store.credentials import CredentialStore, FileKey

MCP_URL = "https://mcp.example/mcp"
ISSUER = "https://as.example"
PRM_URL = "https://mcp.example/.well-known/oauth-protected-resource/mcp"
TOKEN_ENDPOINT = f"{ISSUER}/oauth/token"
REDIRECT_URI = "http://127.0.0.1:8765/oauth/callback"


@dataclass
class FakeServers:
    """RS + AS. ``valid`` is the access token the RS accepts; refresh tokens rotate."""

    pkce_methods: list[str] | None = field(default_factory=lambda: ["S256"])
    valid: str = "at-1"
    refresh: str = "rt-1"
    issued: int = 1
    requests: list[httpx2.Request] = field(default_factory=list)

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def urls(self) -> list[str]:
        return [str(r.url).partition("?")[0] for r in self.requests]

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        url = str(request.url).partition("?")[0]
        if url == MCP_URL:
            if request.headers.get("authorization") == f"Bearer {self.valid}":
                return httpx2.Response(200, json={"ok": True})
            return httpx2.Response(401, headers={"WWW-Authenticate": f'Bearer resource_metadata="{PRM_URL}"'})
        if url == PRM_URL:
            return httpx2.Response(200, json={"resource": MCP_URL, "authorization_servers": [ISSUER]})
        if url == f"{ISSUER}/.well-known/oauth-authorization-server":
            return httpx2.Response(200, json=self.metadata())
        if url == f"{ISSUER}/register":
            body = json.loads(request.content)
            return httpx2.Response(201, json={**body, "client_id": "client-1", "token_endpoint_auth_method": "none"})
        if url == f"{ISSUER}/authorize":
            params = request.url.params
            back = {"code": "code-1", "state": params["state"], "iss": ISSUER}
            return httpx2.Response(302, headers={"Location": f"{params['redirect_uri']}?{urlencode(back)}"})
        if url == TOKEN_ENDPOINT:
            return self._token(parse_qs(request.content.decode()))
        return httpx2.Response(404)

    def metadata(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "issuer": ISSUER,
            "authorization_endpoint": f"{ISSUER}/authorize",
            "token_endpoint": TOKEN_ENDPOINT,
            "registration_endpoint": f"{ISSUER}/register",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "authorization_response_iss_parameter_supported": True,
        }
        if self.pkce_methods is not None:
            doc["code_challenge_methods_supported"] = self.pkce_methods
        return doc

    def _token(self, form: dict[str, list[str]]) -> httpx2.Response:
        grant = form["grant_type"][0]
        if grant == "refresh_token" and form["refresh_token"][0] != self.refresh:
            return httpx2.Response(400, json={"error": "invalid_grant"})
        if grant not in ("authorization_code", "refresh_token"):
            return httpx2.Response(400, json={"error": "unsupported_grant_type"})
        self.issued += 1
        self.valid, self.refresh = f"at-{self.issued}", f"rt-{self.issued}"
        body = {"access_token": self.valid, "token_type": "bearer", "expires_in": 3600, "refresh_token": self.refresh}
        return httpx2.Response(200, json=body)

    def token_requests(self) -> list[dict[str, list[str]]]:
        return [parse_qs(r.content.decode()) for r in self.requests if str(r.url) == TOKEN_ENDPOINT]


def open_store(data: Path) -> CredentialStore:
    """A store on ``data``, as a fresh process would open it."""
    return CredentialStore(data / "credentials.enc", FileKey(data / "credentials.key"))
