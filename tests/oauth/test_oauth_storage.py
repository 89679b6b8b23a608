"""The TokenStorage adapter: sealed round trips, a record per AS, and a silent refresh after a restart."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx2
import pytest
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from sidecar.oauth.flow import HeadlessDriver, build_provider
from sidecar.oauth.storage import CredentialTokenStorage
from sidecar.store.credentials import RecordId
from tests.oauth.fakes import ISSUER, MCP_URL, REDIRECT_URI, TOKEN_ENDPOINT, FakeServers, open_store

OTHER_ISSUER = "https://other-as.example"


def _client(client_id: str, issuer: str) -> OAuthClientInformationFull:
    return OAuthClientInformationFull(client_id=client_id, redirect_uris=[AnyUrl(REDIRECT_URI)], issuer=issuer)


def _storage(data: Path, clock: float | None = None) -> CredentialTokenStorage:
    store = open_store(data)
    if clock is None:
        return CredentialTokenStorage(store, connector="remote", account="me")
    return CredentialTokenStorage(store, connector="remote", account="me", clock=lambda: clock)


class NoPerson:
    """A driver for a restart that must not need anyone: it fails the test if it is asked."""

    calls = 0

    async def authorize(self, url: str) -> AuthorizationCodeResult:
        self.calls += 1
        raise AssertionError("a restart with a live refresh token asked for interactive authorization")


async def _sign_in(data: Path, servers: FakeServers, *, clock: float) -> None:
    """A first run: the whole flow, its tokens saved as if issued at ``clock``."""
    storage = _storage(data, clock)
    driver = HeadlessDriver(transport=servers.transport())
    provider = build_provider(MCP_URL, storage=storage, driver=driver, redirect_uri=REDIRECT_URI)
    async with httpx2.AsyncClient(auth=provider, transport=servers.transport()) as http:
        assert (await http.post(MCP_URL, json={})).status_code == 200
    assert servers.urls().count(f"{ISSUER}/authorize") == 1


async def test_a_grant_round_trips_sealed_with_an_absolute_expiry(data_dir: Path) -> None:
    first = _storage(data_dir, clock=1_000.0)
    await first.set_client_info(_client("client-1", ISSUER))
    await first.set_tokens(OAuthToken(access_token="at-secret", refresh_token="rt-secret", expires_in=3600))

    again = _storage(data_dir)
    assert await again.get_client_info() == _client("client-1", ISSUER)
    tokens = await again.get_tokens()
    assert tokens is not None and (tokens.access_token, tokens.refresh_token) == ("at-secret", "rt-secret")
    record = open_store(data_dir).get(RecordId("remote", "me", ISSUER))
    assert record is not None and record["expires_at"] == 4_600.0
    raw = (data_dir / "credentials.enc").read_bytes()
    assert b"at-secret" not in raw and b"rt-secret" not in raw and b"client-1" not in raw


async def test_nothing_stored_means_nothing_loaded(data_dir: Path) -> None:
    storage = _storage(data_dir)
    assert await storage.get_tokens() is None
    assert await storage.get_client_info() is None


async def test_a_registration_at_another_issuer_keeps_the_first_issuers_record(data_dir: Path) -> None:
    storage = _storage(data_dir, clock=1_000.0)
    await storage.set_client_info(_client("client-a", ISSUER))
    await storage.set_tokens(OAuthToken(access_token="at-a", refresh_token="rt-a", expires_in=60))
    later = _storage(data_dir, clock=2_000.0)
    await later.get_tokens()
    await later.set_client_info(_client("client-b", OTHER_ISSUER))

    store = open_store(data_dir)
    assert {r.issuer for r in store.records("remote")} == {ISSUER, OTHER_ISSUER}
    kept = store.get(RecordId("remote", "me", ISSUER))
    assert kept is not None and kept["tokens"]["refresh_token"] == "rt-a"
    moved = store.get(RecordId("remote", "me", OTHER_ISSUER))
    assert moved is not None and "tokens" not in moved  # the old AS's tokens never follow the client
    assert await _storage(data_dir).get_client_info() == _client("client-b", OTHER_ISSUER)  # newest is current


async def test_a_restart_restores_the_expiry_and_the_discovered_metadata(data_dir: Path, servers: FakeServers) -> None:
    issued_at = time.time() - 7200
    await _sign_in(data_dir, servers, clock=issued_at)

    storage = _storage(data_dir)
    provider = build_provider(MCP_URL, storage=storage, driver=NoPerson(), redirect_uri=REDIRECT_URI)
    await storage.get_tokens()  # what the provider's _initialize does first
    context = provider.context
    assert context.token_expiry_time == pytest.approx(issued_at + 3600)
    assert context.oauth_metadata is not None and str(context.oauth_metadata.token_endpoint) == TOKEN_ENDPOINT
    assert context.protected_resource_metadata is not None
    assert str(context.protected_resource_metadata.resource) == MCP_URL


async def test_a_restart_with_an_expired_token_refreshes_silently_at_the_discovered_endpoint(
    data_dir: Path, servers: FakeServers
) -> None:
    await _sign_in(data_dir, servers, clock=time.time() - 7200)  # the access token expired an hour ago
    servers.requests.clear()

    storage = _storage(data_dir)
    driver = NoPerson()
    provider = build_provider(MCP_URL, storage=storage, driver=driver, redirect_uri=REDIRECT_URI)
    async with httpx2.AsyncClient(auth=provider, transport=servers.transport()) as http:
        assert (await http.post(MCP_URL, json={})).status_code == 200

    assert driver.calls == 0
    assert servers.urls() == [TOKEN_ENDPOINT, MCP_URL]  # no stale bearer, no discovery, no /token guess
    (refresh,) = servers.token_requests()
    assert refresh["grant_type"] == ["refresh_token"] and refresh["refresh_token"] == ["rt-2"]
    assert refresh["resource"] == [MCP_URL]  # RFC 8707 on the refresh, from the restored PRM
    saved = open_store(data_dir).get(RecordId("remote", "me", ISSUER))
    assert saved is not None and saved["tokens"]["refresh_token"] == "rt-3"  # the rotated one
    assert saved["expires_at"] > time.time() + 3000


async def test_no_token_reaches_our_logs(
    data_dir: Path, servers: FakeServers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await _sign_in(data_dir, servers, clock=time.time() - 7200)
    storage = _storage(data_dir)
    provider = build_provider(MCP_URL, storage=storage, driver=NoPerson(), redirect_uri=REDIRECT_URI)
    async with httpx2.AsyncClient(auth=provider, transport=servers.transport()) as http:
        await http.post(MCP_URL, json={})
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("sidecar")]
    assert ours  # the records written are logged, by connector and issuer
    assert not [m for m in ours if "at-" in m or "rt-" in m or "code-1" in m], ours
