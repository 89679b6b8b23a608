"""A small local reverse proxy that adds sidecar's headers, for clients that cannot send custom ones.

The official MCP conformance suite has no way to send headers, but every sidecar route needs a route
token and a session envelope. This proxy listens on 127.0.0.1:0, adds those headers and forwards each
request to the daemon, streaming the response back (SSE included).

It must not hide what the daemon is meant to judge. A Host or Origin that names the proxy itself is
rewritten to name the daemon (that is what a client configured with the daemon's URL would send); any
other Host or Origin (``evil.example.com``) reaches the daemon untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import aiohttp
from aiohttp import web
from yarl import URL

__all__ = ["HeaderProxy"]

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)


class HeaderProxy:
    """``async with HeaderProxy(daemon_url, headers) as proxy``: ``proxy.url`` is where clients connect."""

    def __init__(self, daemon_url: str, headers: Mapping[str, str]) -> None:
        self._daemon = URL(daemon_url)
        self._headers = dict(headers)
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> HeaderProxy:
        self._client = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    def _own(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def _host(self, sent: str | None) -> str:
        if sent is None or sent in self._own():
            return f"{self._daemon.host}:{self._daemon.port}"
        return sent  # foreign: the daemon must see it as it came

    def _origin(self, sent: str) -> str:
        if sent.removeprefix("http://") in self._own():
            return f"http://{self._daemon.host}:{self._daemon.port}"
        return sent  # foreign: the daemon must see it as it came

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers.update(self._headers)
        headers["Host"] = self._host(request.headers.get("Host"))
        if "Origin" in headers:
            headers["Origin"] = self._origin(headers["Origin"])
        body = await request.read()
        target = self._daemon.with_path(request.path).with_query(request.query)
        async with self._client.request(
            request.method, target, headers=headers, data=body or None, allow_redirects=False
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionError:
                pass  # the client hung up mid-stream (it ends a subscription that way): so does the proxy
            return response
