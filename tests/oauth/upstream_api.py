"""A stand-in for a provider's REST API: accepts only tokens its AS says are active (RFC 7662 introspection).

In-process aiohttp app on 127.0.0.1:0 for the internal API tests. It records every request it receives
(method, path, whether a bearer came with it) so a test can assert that a refused request sent nothing.

- ``GET /items/<n>`` → ``{"item": n}``, with a ``Set-Cookie`` and an ``X-RateLimit-Remaining`` header;
- ``GET /slow`` → holds the answer until ``release`` is set (a call to cut by revocation);
- ``GET /items/away`` → 302 to ``away`` (another origin);
- anything with an inactive token → 401 with ``WWW-Authenticate: Bearer error="invalid_token"``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
from aiohttp import web


@dataclass
class Upstream:
    issuer: str
    away: str = "http://127.0.0.1:9/elsewhere"
    seen: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    slow_started: asyncio.Event = field(default_factory=asyncio.Event)

    async def _active(self, token: str) -> bool:
        async with httpx2.AsyncClient(timeout=10) as http:
            answer = await http.post(
                f"{self.issuer}/token/introspection", data={"token": token}, auth=("rs", "rs-secret")
            )
        data = answer.json() if answer.status_code == 200 else {}
        return bool(data.get("active")) and not (data.get("exp") and data["exp"] < time.time())

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append({"method": request.method, "path": request.raw_path, "bearer": auth.startswith("Bearer ")})
        token = auth.removeprefix("Bearer ")
        if not auth.startswith("Bearer ") or not await self._active(token):
            return web.json_response(
                {"message": "Bad credentials"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token", error_description="expired"'},
            )
        self.tokens.append(token)
        if request.path == "/slow":
            self.slow_started.set()
            await self.release.wait()
        if request.path == "/items/away":
            raise web.HTTPFound(self.away)
        headers = {"Set-Cookie": "session=upstream-secret; HttpOnly", "X-RateLimit-Remaining": "4999"}
        return web.json_response({"item": request.path.rsplit("/", 1)[-1]}, headers=headers)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app
