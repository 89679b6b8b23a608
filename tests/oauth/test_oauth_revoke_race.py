"""A revoke wins over a refresh or a sign-in already in flight (issue 24), at the broker's seam.

A small AS on ``127.0.0.1:0`` holds each token request at a gate the test opens, so the revoke runs
exactly while the request is out: the tokens it answers with must never be stored, must be revoked at
its revocation endpoint with the rest, and the grant must stay gone (memory, store, state). The races
through the whole daemon against a real AS are ``tests/e2e/test_revoke_race.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aiohttp import web
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
from pydantic import AnyUrl

from sidecar.oauth.broker import ACCOUNT, Broker
from sidecar.oauth.grant import NeedsAuthorization, SignIn
from sidecar.oauth.provider import ProviderClient
from sidecar.oauth.storage import CredentialTokenStorage, StoredGrant
from sidecar.store.credentials import CredentialStore, RecordId
from tests.oauth.fakes import open_store

BOUND = 10.0
REDIRECT = "http://127.0.0.1:9/oauth/callback"


@dataclass
class GatedAs:
    """Token endpoint (rotating, held at ``gate``) and RFC 7009 revocation endpoint (records tokens)."""

    url: str = ""
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    issued: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    count: int = 1

    async def token(self, request: web.Request) -> web.Response:
        self.asked.set()
        await self.gate.wait()
        self.count += 1
        access, refresh = f"at-{self.count}", f"rt-{self.count}"
        self.issued += [access, refresh]
        body = {"access_token": access, "refresh_token": refresh, "token_type": "Bearer", "expires_in": 3600}
        return web.json_response(body)

    async def revoke(self, request: web.Request) -> web.Response:
        self.revoked.append(str((await request.post())["token"]))
        return web.Response()

    def metadata(self) -> OAuthMetadata:
        return OAuthMetadata.model_validate(
            {
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "revocation_endpoint": f"{self.url}/revoke",
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
            }
        )


@pytest.fixture
async def gated_as() -> AsyncIterator[GatedAs]:
    server = GatedAs()
    app = web.Application()
    app.router.add_post("/token", server.token)
    app.router.add_post("/revoke", server.revoke)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        server.gate.set()  # nothing stays held
        await runner.cleanup()


@dataclass
class Revoked:
    """A broker's ``revoked`` announcement (after the delete, before it waits for work in flight)."""

    seen: asyncio.Event = field(default_factory=asyncio.Event)
    cancel: list[asyncio.Task[Any]] = field(default_factory=list)

    async def __call__(self, connector_id: str, event: str) -> None:
        if event == "revoked":
            for task in self.cancel:  # as the daemon stops the connector's calls in flight
                task.cancel()
            self.seen.set()


def _grant(server: GatedAs, expires_at: float) -> StoredGrant:
    return StoredGrant(
        client=OAuthClientInformationFull(client_id="client-1", redirect_uris=[AnyUrl(REDIRECT)]),
        tokens=OAuthToken(access_token="at-1", token_type="Bearer", expires_in=60, refresh_token="rt-1"),
        expires_at=expires_at,
        issued_at=expires_at - 60,
        authorization_server=server.metadata(),
        saved_at=1.0,
    )


async def _broker(
    tmp_path: Path, server: GatedAs, audit: list[dict[str, Any]], *, expires_at: float = 1.0
) -> tuple[Broker, CredentialStore]:
    """A broker whose grant's access token expired long ago (the next call refreshes), or at ``expires_at``."""
    store = open_store(tmp_path)
    secret = _grant(server, expires_at).model_dump(mode="json", exclude_none=True)
    store.put(RecordId("remote", ACCOUNT, server.url), secret, generation=0)
    broker = Broker(store, redirect_uri=lambda: REDIRECT, audit=lambda event, **fields: audit.append(fields))
    await broker.load({"remote": False})
    assert broker.keeper("remote").state is SignIn.READY
    return broker, store


async def _held(server: GatedAs) -> None:
    async with asyncio.timeout(BOUND):
        await server.asked.wait()


@pytest.mark.parametrize("how", ["ahead of expiry", "after a 401", "whose caller is cancelled"])
async def test_a_refresh_held_at_the_as_while_revoke_runs_is_discarded_and_revoked(
    tmp_path: Path, gated_as: GatedAs, how: str
) -> None:
    audit: list[dict[str, Any]] = []
    broker, store = await _broker(tmp_path, gated_as, audit)
    keeper = broker.keeper("remote")
    revoked = Revoked()
    broker.subscribe(revoked)
    # a call's refresh ahead of expiry, or the internal API's refresh after an upstream 401
    call = asyncio.ensure_future(keeper.access_token() if how == "ahead of expiry" else keeper.rejected("at-1"))
    if how == "whose caller is cancelled":
        revoked.cancel.append(call)
    await _held(gated_as)

    revoking = asyncio.ensure_future(broker.revoke("remote"))
    async with asyncio.timeout(BOUND):
        await revoked.seen.wait()  # deleted and announced; the refresh is still out
    assert store.records("remote") == []
    gated_as.gate.set()
    async with asyncio.timeout(BOUND):
        answer = await revoking
        with contextlib.suppress(asyncio.CancelledError), pytest.raises(NeedsAuthorization):
            await call

    assert answer["remote"] == "revoked" and answer["deleted"] == 1, answer
    assert gated_as.issued == ["at-2", "rt-2"]
    assert set(gated_as.revoked) == {"at-1", "rt-1", "at-2", "rt-2"}  # what was stored and what came late
    assert store.records("remote") == [] and open_store(tmp_path).records("remote") == []  # and after a restart
    assert keeper.state is SignIn.NEEDED and not await _usable(keeper)
    assert audit[-1]["remote"] == "revoked"


async def _usable(keeper: Any) -> bool:
    try:
        return await keeper.access_token() is not None
    except NeedsAuthorization:
        return False


async def test_a_refresh_that_outlasts_the_revokes_wait_is_revoked_in_the_background(
    tmp_path: Path, gated_as: GatedAs, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.oauth import broker as broker_module

    monkeypatch.setattr(broker_module, "SETTLE_TIMEOUT", 0.0)  # the production wait is ten seconds
    audit: list[dict[str, Any]] = []
    broker, store = await _broker(tmp_path, gated_as, audit)
    call = asyncio.ensure_future(broker.keeper("remote").access_token())
    await _held(gated_as)

    async with asyncio.timeout(BOUND):
        answer = await broker.revoke("remote")
    assert answer["remote"] == "retrying", answer  # the background goes on: it says so
    gated_as.gate.set()
    async with asyncio.timeout(BOUND):
        with pytest.raises(NeedsAuthorization):
            await call
        while {"at-2", "rt-2"} - set(gated_as.revoked):
            await asyncio.sleep(0.01)
    assert store.records("remote") == []
    assert set(gated_as.revoked) == {"at-1", "rt-1", "at-2", "rt-2"}
    async with asyncio.timeout(BOUND):
        while audit[-1].get("remote") != "revoked":
            await asyncio.sleep(0.01)
    await broker.close()


async def test_a_sign_in_whose_token_exchange_is_out_during_a_revoke_stores_nothing(
    tmp_path: Path, gated_as: GatedAs
) -> None:
    audit: list[dict[str, Any]] = []
    store = open_store(tmp_path)
    broker = Broker(store, redirect_uri=lambda: REDIRECT, audit=lambda event, **fields: audit.append(fields))
    revoked = Revoked()
    broker.subscribe(revoked)
    provider = ProviderClient(
        "pkg",
        "client-1",
        authorization_endpoint=f"{gated_as.url}/authorize",
        token_endpoint=f"{gated_as.url}/token",
        revocation_endpoint=f"{gated_as.url}/revoke",
    )
    started = await broker.connect_provider("pkg", provider)
    state = started["authorization_url"].partition("state=")[2].partition("&")[0]
    link = parse_qs(urlsplit(started["browser_url"]).query)
    opened = broker.open_in_browser(link["flow"][0], link["key"][0])
    assert opened is not None
    cookies = dict([opened[1]])
    callback = asyncio.ensure_future(broker.complete(state=state, code="code-1", iss=None, error=None, cookies=cookies))
    await _held(gated_as)  # the code is being exchanged

    revoking = asyncio.ensure_future(broker.revoke("pkg"))
    async with asyncio.timeout(BOUND):
        await revoked.seen.wait()
    gated_as.gate.set()
    async with asyncio.timeout(BOUND):
        answer = await revoking
        page = await callback

    assert not page.ok and "did not complete" in page.message
    assert answer["remote"] == "revoked", answer
    assert set(gated_as.revoked) == {"at-2", "rt-2"}  # the sign-in's tokens, which nothing stored
    assert store.records("pkg") == []
    assert broker.keeper("pkg").state is SignIn.NEEDED


async def test_a_revoke_also_ends_an_access_token_a_refresh_replaced_before_it_expired(
    tmp_path: Path, gated_as: GatedAs
) -> None:
    broker, _ = await _broker(tmp_path, gated_as, [], expires_at=time.time() + 3600)
    gated_as.gate.set()
    async with asyncio.timeout(BOUND):
        assert await broker.keeper("remote").rejected("at-1") == "at-2"  # an upstream 401 forced a refresh
        answer = await broker.revoke("remote")
    assert answer["remote"] == "revoked", answer
    # at-1 is valid at the AS for another hour: an AS that ends only the token named must be told of it
    assert sorted(gated_as.revoked) == ["at-1", "at-2", "rt-2"]


async def test_a_write_for_a_grant_revoked_since_it_began_is_refused_and_handed_back(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    handed: list[StoredGrant] = []
    storage = CredentialTokenStorage(store, connector="remote", account=ACCOUNT, discarded=handed.append)
    assert await storage.current() is None
    store.revoke_connector("remote")
    tokens = OAuthToken(access_token="at-late", token_type="Bearer", expires_in=60)
    from sidecar.errors import StaleGrant

    with pytest.raises(StaleGrant):
        await storage.set_tokens(tokens)
    assert store.records("remote") == [] and storage.stale()
    assert [grant.tokens.access_token for grant in handed if grant.tokens] == ["at-late"]
