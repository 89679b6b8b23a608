"""The internal API's forwarder against a real HTTP upstream on 127.0.0.1:0, with a token source faked at its seam."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from sidecar.errors import Forbidden, UpstreamFailed
from sidecar.oauth.forward import Forwarder, UpstreamResponse
from sidecar.oauth.grant import NeedsAuthorization
from sidecar.oauth.target import UpstreamRule


@dataclass
class Tokens:
    """Hands out ``current``; a rejection moves to ``after`` once (None: the grant cannot be refreshed)."""

    current: str = "t1"
    after: str | None = "t2"
    connector_id: str = "c"
    refreshes: int = 0

    async def access_token(self) -> str | None:
        return self.current

    async def rejected(self, token: str | None) -> str:
        if self.after is None:
            raise NeedsAuthorization(self.connector_id)
        self.refreshes += 1
        self.current, self.after = self.after, None
        return self.current


@dataclass
class Upstream:
    seen: list[dict[str, Any]] = field(default_factory=list)
    accept: str = "t1"
    base: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append({"path": request.path, "headers": dict(request.headers)})
        if request.headers.get("Authorization") != f"Bearer {self.accept}":
            return web.json_response({}, status=401, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if request.path == "/api/big":
            return web.Response(body=b"x" * 2048)
        if request.path == "/api/moved":
            raise web.HTTPFound(f"{self.base}/api/items/9")
        if request.path == "/api/escape":
            raise web.HTTPFound(f"{self.base}/admin")
        headers = {"Set-Cookie": "s=1", "Authorization": "Bearer leaked", "ETag": '"e"', "X-RateLimit-Limit": "5"}
        return web.json_response({"path": request.path}, headers=headers)


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    found = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    found.base = f"http://127.0.0.1:{port}"
    yield found
    await runner.cleanup()


async def _forward(
    upstream: Upstream, path: str, tokens: Tokens, headers: dict[str, str] | None = None, **kw: Any
) -> UpstreamResponse:
    rule = UpstreamRule(
        base_url=upstream.base + "/api",
        paths=["/items/", "/big", "/moved", "/escape"],
        methods=["GET"],
        headers=["X-GitHub-Api-Version"],
    )
    forwarder = Forwarder(**kw)
    try:
        return await forwarder.forward(
            tokens, rule, rule.resolve("GET", path, ""), method="GET", headers=headers or {}, body=b""
        )
    finally:
        await forwarder.close()


async def test_the_token_is_attached_and_only_safe_headers_go_either_way(upstream: Upstream) -> None:
    sent = {"Accept": "application/json", "Cookie": "c=1", "Authorization": "Bearer mine", "X-Sidecar-Context": "v1"}
    answer = await _forward(upstream, "/items/1", Tokens(), sent | {"X-GitHub-Api-Version": "2022-11-28"})
    assert answer.status == 200 and answer.body == b'{"path": "/api/items/1"}'
    got = upstream.seen[-1]["headers"]
    assert got["Authorization"] == "Bearer t1" and got["X-GitHub-Api-Version"] == "2022-11-28"
    assert "Cookie" not in got and "X-Sidecar-Context" not in got
    names = {name.lower() for name in answer.headers}
    assert {"etag", "x-ratelimit-limit", "content-type"} <= names
    assert not names & {"set-cookie", "authorization", "www-authenticate"}


async def test_only_declared_x_headers_go_and_none_that_rewrites_the_request(upstream: Upstream) -> None:
    sent = {
        "X-GitHub-Api-Version": "2022-11-28",  # declared
        "X-Other": "1",  # not declared
        "X-HTTP-Method-Override": "DELETE",
        "X-Method-Override": "DELETE",
        "X-Original-URL": "/admin",
        "X-Rewrite-URL": "/admin",
        "X-Forwarded-For": "10.0.0.1",
        "If-None-Match": '"e1"',
        "Connection": "If-None-Match",  # hop-by-hop by name: not forwarded either
    }
    await _forward(upstream, "/items/1", Tokens(), sent)
    got = {name.lower() for name in upstream.seen[-1]["headers"]}
    assert "x-github-api-version" in got
    assert not got & {name.lower() for name in sent if name != "X-GitHub-Api-Version"}, got


def test_a_package_may_not_declare_a_header_that_rewrites_the_request() -> None:
    from pydantic import ValidationError

    from sidecar.connectors.manifest.oauth_client import UpstreamFile

    base = {"base_url": "https://api.example.com", "paths": ["/"], "methods": ["GET"]}
    assert UpstreamFile.model_validate({**base, "headers": ["X-Api-Version"]}).headers == ["x-api-version"]
    for name in ("X-HTTP-Method-Override", "x-original-url", "X-Sidecar-Context", "X-Forwarded-Host", "Accept", "X-"):
        with pytest.raises(ValidationError):
            UpstreamFile.model_validate({**base, "headers": [name]})


async def test_a_401_refreshes_once_and_retries_once_then_is_unauthorized(upstream: Upstream) -> None:
    upstream.accept = "t2"
    tokens = Tokens()
    assert (await _forward(upstream, "/items/1", tokens)).status == 200
    assert tokens.refreshes == 1 and [s["headers"]["Authorization"] for s in upstream.seen] == [
        "Bearer t1",
        "Bearer t2",
    ]
    upstream.accept = "never"
    with pytest.raises(NeedsAuthorization):
        await _forward(upstream, "/items/1", Tokens())
    assert len(upstream.seen) == 4  # one try and one retry, no more


async def test_redirects_are_followed_only_within_the_declared_upstream(upstream: Upstream) -> None:
    answer = await _forward(upstream, "/moved", Tokens())
    assert answer.status == 200 and upstream.seen[-1]["path"] == "/api/items/9"
    with pytest.raises(Forbidden):
        await _forward(upstream, "/escape", Tokens())
    assert upstream.seen[-1]["path"] == "/api/escape"  # /admin was never asked for


async def test_an_answer_over_the_bound_fails_instead_of_being_passed_on(upstream: Upstream) -> None:
    with pytest.raises(UpstreamFailed):
        await _forward(upstream, "/big", Tokens(), max_bytes=1024)
