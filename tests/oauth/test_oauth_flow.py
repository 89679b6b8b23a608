"""The provider's additions to the SDK: the S256 rule, the authorization-URL rule and the headless driver."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from sidecar.oauth.capped import TokenCap, TokenResponseTooLarge
from sidecar.oauth.flow import (
    AuthorizationRefused,
    HeadlessDriver,
    build_provider,
    check_authorization_url,
    require_s256,
)
from sidecar.oauth.storage import CredentialTokenStorage
from tests.oauth.fakes import ISSUER, MCP_URL, REDIRECT_URI, TOKEN_ENDPOINT, FakeServers, open_store


@pytest.mark.parametrize("methods", [None, [], ["plain"]], ids=["absent", "empty", "plain-only"])
async def test_an_as_without_s256_is_refused_before_its_authorize_endpoint_is_asked(
    data_dir: Path, methods: list[str] | None
) -> None:
    servers = FakeServers(pkce_methods=methods)
    storage = CredentialTokenStorage(open_store(data_dir), connector="remote", account="me")
    driver = HeadlessDriver(transport=servers.transport())
    provider = build_provider(MCP_URL, storage=storage, driver=driver, redirect_uri=REDIRECT_URI)
    async with httpx2.AsyncClient(auth=provider, transport=servers.transport()) as http:
        with pytest.raises(AuthorizationRefused, match="does not advertise PKCE S256"):
            await http.post(MCP_URL, json={})
    assert f"{ISSUER}/.well-known/oauth-authorization-server" in servers.urls()  # it did discover
    assert f"{ISSUER}/authorize" not in servers.urls()
    assert servers.token_requests() == []


def test_no_metadata_at_all_is_the_2025_03_26_fallback_and_passes() -> None:
    require_s256(None)


@pytest.mark.parametrize(
    "url",
    ["https://as.example/authorize?x=1", "http://127.0.0.1:9/authorize", "http://localhost:9/a", "http://[::1]:9/a"],
)
def test_https_or_loopback_http_authorization_urls_may_be_opened(url: str) -> None:
    check_authorization_url(url)


@pytest.mark.parametrize(
    "url",
    ["http://as.example/authorize", "javascript:alert(1)", "data:text/html,hi", "file:///etc/passwd", "https:///x"],
)
def test_other_authorization_urls_are_refused(url: str) -> None:
    with pytest.raises(AuthorizationRefused):
        check_authorization_url(url)


def _answering(response: httpx2.Response) -> httpx2.MockTransport:
    return httpx2.MockTransport(lambda request: response)


async def test_the_headless_driver_reads_code_state_and_iss_from_the_redirect() -> None:
    location = "http://localhost:3000/callback?code=c-1&state=s-1&iss=https%3A%2F%2Fas.example"
    driver = HeadlessDriver(transport=_answering(httpx2.Response(302, headers={"Location": location})))
    result = await driver.authorize("https://as.example/authorize")
    assert (result.code, result.state, result.iss) == ("c-1", "s-1", "https://as.example")


async def test_the_headless_driver_refuses_an_answer_that_is_not_a_redirect_with_a_code() -> None:
    with pytest.raises(AuthorizationRefused, match="answered 200"):
        await HeadlessDriver(transport=_answering(httpx2.Response(200))).authorize("https://as.example/a")
    denied = httpx2.Response(302, headers={"Location": "http://localhost:3000/callback?error=access_denied"})
    with pytest.raises(AuthorizationRefused, match="access_denied"):
        await HeadlessDriver(transport=_answering(denied)).authorize("https://as.example/a")


async def test_a_remote_sign_in_whose_token_answer_is_over_64_kib_fails_and_stores_no_token(data_dir: Path) -> None:
    class HugeTokens(FakeServers):
        def handle(self, request: httpx2.Request) -> httpx2.Response:
            if str(request.url) == TOKEN_ENDPOINT:
                self.requests.append(request)
                return httpx2.Response(200, json={"access_token": "A" * 70_000, "token_type": "bearer"})
            return super().handle(request)

    servers = HugeTokens()
    storage = CredentialTokenStorage(open_store(data_dir), connector="remote", account="me")
    driver = HeadlessDriver(transport=servers.transport())
    provider = build_provider(MCP_URL, storage=storage, driver=driver, redirect_uri=REDIRECT_URI)
    async with httpx2.AsyncClient(auth=provider, transport=TokenCap(servers.transport())) as http:
        with pytest.raises(TokenResponseTooLarge):
            await http.post(MCP_URL, json={})
    assert len(servers.token_requests()) == 1  # the code was redeemed, and the answer dropped
    assert await CredentialTokenStorage(open_store(data_dir), connector="remote", account="me").get_tokens() is None
