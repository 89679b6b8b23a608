"""The grant keeper's rules: refresh ahead of expiry, once at a time, backoff, the cap, a dead grant.

Unit tests at the keeper's seams: a clock the test moves, the credential store on disk, and an in-memory
token endpoint (``httpx2.MockTransport``) that rotates refresh tokens. The real-AS tests are in
``tests/e2e/test_oauth_broker.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import parse_qs

import httpx2
import pytest
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
from pydantic import AnyUrl

from sidecar.errors import ToolError
from sidecar.oauth.grant import TOKEN_REQUESTS, GrantKeeper, NeedsAuthorization, SignIn, refresh_margin
from sidecar.oauth.storage import CredentialTokenStorage, StoredGrant
from sidecar.store.credentials import RecordId
from tests.oauth.fakes import ISSUER, TOKEN_ENDPOINT, open_store

LIFETIME = 3600.0
T0 = 1_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class TokenEndpoint:
    """Rotating refresh tokens; ``answer`` overrides what it says (a status and a JSON body)."""

    def __init__(self) -> None:
        self.refresh = "rt-1"
        self.issued = 1
        self.calls = 0
        self.answer: tuple[int, dict[str, object]] | None = None

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        assert str(request.url) == TOKEN_ENDPOINT
        self.calls += 1
        if self.answer is not None:
            return httpx2.Response(self.answer[0], json=self.answer[1])
        form = parse_qs(request.content.decode())
        if form["refresh_token"][0] != self.refresh:
            return httpx2.Response(400, json={"error": "invalid_grant"})
        self.issued += 1
        self.refresh = f"rt-{self.issued}"
        body = {"access_token": f"at-{self.issued}", "token_type": "bearer", "expires_in": LIFETIME}
        return httpx2.Response(200, json={**body, "refresh_token": self.refresh})


def _metadata() -> OAuthMetadata:
    return OAuthMetadata.model_validate(
        {
            "issuer": ISSUER,
            "authorization_endpoint": f"{ISSUER}/authorize",
            "token_endpoint": TOKEN_ENDPOINT,
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }
    )


async def _keeper(tmp_path: Path, clock: Clock, endpoint: TokenEndpoint, audit: list[str]) -> GrantKeeper:
    store = open_store(tmp_path)
    grant = StoredGrant(
        client=OAuthClientInformationFull(client_id="client-1", redirect_uris=[AnyUrl("http://127.0.0.1:1/cb")]),
        tokens=OAuthToken(access_token="at-1", token_type="Bearer", expires_in=int(LIFETIME), refresh_token="rt-1"),
        expires_at=T0 + LIFETIME,
        issued_at=T0,
        authorization_server=_metadata(),
        saved_at=T0,
    )
    store.put(RecordId("remote", "default", ISSUER), grant.model_dump(mode="json", exclude_none=True), generation=0)
    storage = CredentialTokenStorage(store, connector="remote", account="default", clock=clock)
    keeper = GrantKeeper(
        "remote",
        storage,
        audit=lambda event, **fields: audit.append(event),
        clock=clock,
        transport=endpoint.transport(),
    )
    await keeper.load()
    return keeper


@pytest.mark.parametrize(("lifetime", "margin"), [(3600.0, 60.0), (100.0, 10.0), (None, 60.0), (0.0, 60.0)])
def test_a_token_is_refreshed_a_minute_early_or_a_tenth_of_its_life(lifetime: float | None, margin: float) -> None:
    assert refresh_margin(lifetime) == margin


async def test_a_token_is_used_until_its_margin_and_refreshed_once_inside_it(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)

    clock.now = T0 + LIFETIME - 61
    assert await keeper.access_token() == "at-1" and endpoint.calls == 0
    clock.now = T0 + LIFETIME - 59
    assert await keeper.access_token() == "at-2" and endpoint.calls == 1
    assert await keeper.access_token() == "at-2" and endpoint.calls == 1  # the new token has its own life
    assert keeper.state is SignIn.READY


async def test_many_callers_inside_the_margin_spend_the_refresh_token_once(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    clock.now = T0 + LIFETIME + 5  # expired: every caller needs a new token
    tokens = await asyncio.gather(*(keeper.access_token() for _ in range(20)))
    assert set(tokens) == {"at-2"} and endpoint.calls == 1


async def test_a_refused_refresh_drops_the_tokens_and_asks_for_a_sign_in(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    endpoint.answer = (400, {"error": "invalid_grant"})
    clock.now = T0 + LIFETIME + 5
    with pytest.raises(NeedsAuthorization, match="sidecar connectors connect remote"):
        await keeper.access_token()
    assert keeper.state is SignIn.NEEDED and audit == ["oauth.refresh_failed"]
    stored = await CredentialTokenStorage(open_store(tmp_path), connector="remote", account="default").current()
    assert stored is not None and stored.tokens is None and stored.client is not None  # registration kept
    with pytest.raises(NeedsAuthorization):
        await keeper.access_token()
    assert endpoint.calls == 1  # nothing more is asked of the AS until a new sign-in


async def test_a_server_error_keeps_the_tokens_and_backs_off(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    endpoint.answer = (503, {"error": "temporarily_unavailable"})
    clock.now = T0 + LIFETIME - 30  # due, not expired: the old token still serves meanwhile
    assert await keeper.access_token() == "at-1" and endpoint.calls == 1
    assert await keeper.access_token() == "at-1" and endpoint.calls == 1  # backing off: no new request
    assert keeper.state is SignIn.READY and audit == ["oauth.refresh_failed"]

    endpoint.answer = None
    clock.now += 2  # past the first backoff (1 s)
    assert await keeper.access_token() == "at-2" and endpoint.calls == 2


async def test_an_expired_token_during_a_backoff_is_a_clear_error_not_a_dead_grant(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    endpoint.answer = (500, {})
    clock.now = T0 + LIFETIME + 1
    with pytest.raises(ToolError, match="could not refresh") as refused:
        await keeper.access_token()
    assert not isinstance(refused.value, NeedsAuthorization)
    assert keeper.state is SignIn.READY  # the tokens are kept: the AS's trouble, not the grant's


async def test_token_requests_are_capped_per_grant(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    token = "at-1"
    for _ in range(TOKEN_REQUESTS):  # a server that keeps rejecting fresh tokens forces refresh after refresh
        token = await keeper.rejected(token)
    assert endpoint.calls == TOKEN_REQUESTS
    with pytest.raises(ToolError, match="too many token requests"):
        await keeper.rejected(token)
    assert endpoint.calls == TOKEN_REQUESTS
    clock.now += 31  # the window has passed
    assert await keeper.rejected(token) != token and endpoint.calls == TOKEN_REQUESTS + 1


async def test_many_calls_rejected_with_the_same_token_force_one_refresh(tmp_path: Path) -> None:
    """The server revoked the access token early: every call holding it gets 401 at once."""
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    retried = await asyncio.gather(*(keeper.rejected("at-1") for _ in range(10)))
    assert set(retried) == {"at-2"} and endpoint.calls == 1


async def test_a_refresh_answer_over_64_kib_is_refused_and_the_stored_tokens_stay(tmp_path: Path) -> None:
    clock, endpoint, audit = Clock(), TokenEndpoint(), []
    keeper = await _keeper(tmp_path, clock, endpoint, audit)
    endpoint.answer = (200, {"access_token": "A" * 70_000, "token_type": "bearer", "refresh_token": "rt-big"})
    clock.now = T0 + LIFETIME - 30
    assert await keeper.access_token() == "at-1" and endpoint.calls == 1  # the old token serves, backing off
    assert audit == ["oauth.refresh_failed"]
    stored = await CredentialTokenStorage(open_store(tmp_path), connector="remote", account="default").get_tokens()
    assert stored is not None and (stored.access_token, stored.refresh_token) == ("at-1", "rt-1")
