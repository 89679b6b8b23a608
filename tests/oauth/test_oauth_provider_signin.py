"""A package's provider sign-in (``oauth.provider``): the issuer checks (RFC 8414 §3.3, RFC 9207 §2.4),
PKCE and discovery, against an in-memory AS. A refused authorization response stores nothing and
never reaches the token endpoint."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from mcp.shared.auth import AuthorizationCodeResult

from sidecar.errors import AuthorizationRefused
from sidecar.oauth.grant import GrantKeeper
from sidecar.oauth.provider import ProviderClient, sign_in
from sidecar.oauth.storage import CredentialTokenStorage
from tests.oauth.fakes import REDIRECT_URI, open_store

ISSUER = "https://as.example"
TOKEN_ENDPOINT = "https://as.example/oauth/token"
METADATA_URL = "https://as.example/.well-known/oauth-authorization-server"


@dataclass
class _ProviderAs:
    """An AS for a package's provider: its metadata document, its token endpoint, the requests it saw."""

    issuer: str = ISSUER
    promises_iss: bool = True
    requests: list[httpx2.Request] = field(default_factory=list)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        url = str(request.url).partition("?")[0]
        if url.startswith("https://as.example/.well-known/"):
            return httpx2.Response(200, json=self.metadata())
        if url == TOKEN_ENDPOINT:
            return httpx2.Response(200, json={"access_token": "at-1", "token_type": "Bearer", "expires_in": 3600})
        return httpx2.Response(404)

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{ISSUER}/authorize",
            "token_endpoint": TOKEN_ENDPOINT,
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "authorization_response_iss_parameter_supported": self.promises_iss,
        }

    def urls(self) -> list[str]:
        return [str(r.url).partition("?")[0] for r in self.requests]


@dataclass
class _Browser:
    """Comes back from the authorization URL with a code, its state, and ``iss`` as the test says."""

    iss: str | None
    seen: list[str] = field(default_factory=list)

    async def authorize(self, url: str) -> AuthorizationCodeResult:
        self.seen.append(url)
        state = parse_qs(urlsplit(url).query)["state"][0]
        return AuthorizationCodeResult(code="code-1", state=state, iss=self.iss)


async def _sign_in(
    tmp_path: Path,
    server: _ProviderAs,
    browser: _Browser,
    *,
    issuer: str | None = ISSUER,
    metadata_url: str | None = None,
) -> CredentialTokenStorage:
    storage = CredentialTokenStorage(open_store(tmp_path), connector="pkg", account="default")
    provider = ProviderClient("pkg", "client-1", issuer=issuer, metadata_url=metadata_url)
    transport = httpx2.MockTransport(server.handle)
    await sign_in(provider, storage=storage, driver=browser, redirect_uri=REDIRECT_URI, transport=transport)
    return storage


async def _refused(
    tmp_path: Path, server: _ProviderAs, browser: _Browser, words: str, *, issuer: str | None = ISSUER, **more: str
) -> None:
    with pytest.raises(AuthorizationRefused, match=words):
        await _sign_in(tmp_path, server, browser, issuer=issuer, **more)
    assert TOKEN_ENDPOINT not in server.urls()  # the code was never redeemed
    storage = CredentialTokenStorage(open_store(tmp_path), connector="pkg", account="default")
    assert await storage.get_tokens() is None and await storage.get_client_info() is None


async def test_a_matching_iss_signs_in_and_stores_the_grant(tmp_path: Path) -> None:
    server = _ProviderAs()
    storage = await _sign_in(tmp_path, server, _Browser(iss=ISSUER))
    tokens = await storage.get_tokens()
    assert tokens is not None and tokens.access_token == "at-1"


async def test_a_response_without_iss_is_refused_when_the_server_promised_one(tmp_path: Path) -> None:
    await _refused(tmp_path, _ProviderAs(promises_iss=True), _Browser(iss=None), "lacks the iss")


async def test_a_response_without_iss_proceeds_when_the_server_promised_none(tmp_path: Path) -> None:
    storage = await _sign_in(tmp_path, _ProviderAs(promises_iss=False), _Browser(iss=None))
    assert await storage.get_tokens() is not None


async def test_a_present_iss_is_compared_even_when_the_server_promised_none(tmp_path: Path) -> None:
    server = _ProviderAs(promises_iss=False)
    await _refused(tmp_path, server, _Browser(iss="https://evil.example"), "another issuer")


async def test_an_iss_that_differs_from_the_issuer_only_by_a_trailing_slash_is_refused(tmp_path: Path) -> None:
    """RFC 9207 §2.4: simple string comparison, no normalisation (the old check stripped the slash)."""
    server = _ProviderAs(issuer=f"{ISSUER}/")
    await _refused(tmp_path, server, _Browser(iss=ISSUER), "another issuer", issuer=f"{ISSUER}/")


async def test_an_iss_that_matches_only_the_parsers_form_of_the_issuer_is_refused(tmp_path: Path) -> None:
    """The metadata's issuer is compared as the AS wrote it: a document whose ``issuer`` the URL parser
    rewrites (case, default port) is refused, so no ``iss`` can match a string the AS never sent."""
    server = _ProviderAs(issuer="https://AS.example:443")
    await _refused(tmp_path, server, _Browser(iss=ISSUER), "non-canonical", issuer=None, metadata_url=METADATA_URL)


async def test_metadata_naming_another_issuer_is_refused_before_any_authorization(tmp_path: Path) -> None:
    browser = _Browser(iss=ISSUER)
    await _refused(tmp_path, _ProviderAs(issuer="https://other.example"), browser, "names another issuer")
    assert browser.seen == []


async def test_the_code_goes_back_with_the_verifier_of_the_s256_challenge_sent(tmp_path: Path) -> None:
    server, browser = _ProviderAs(), _Browser(iss=ISSUER)
    await _sign_in(tmp_path, server, browser)
    query = parse_qs(urlsplit(browser.seen[0]).query)
    assert query["code_challenge_method"] == ["S256"]
    token_request = next(r for r in server.requests if str(r.url) == TOKEN_ENDPOINT)
    verifier = parse_qs(token_request.content.decode())["code_verifier"][0]
    digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert query["code_challenge"] == [digest] and 43 <= len(verifier) <= 128


async def test_an_issuer_with_a_path_is_discovered_path_inserted_first(tmp_path: Path) -> None:
    """RFC 8414 §3.1, then OpenID Connect Discovery; the first document that answers is used."""
    server = _ProviderAs(issuer=f"{ISSUER}/tenant")
    await _sign_in(tmp_path, server, _Browser(iss=f"{ISSUER}/tenant"), issuer=f"{ISSUER}/tenant")
    assert server.urls()[0] == f"{ISSUER}/.well-known/oauth-authorization-server/tenant"


class _HugeTokenAs(_ProviderAs):
    """Answers the code with a body over 64 KiB: with its length declared, or chunked without one."""

    def __init__(self, *, declared: bool) -> None:
        super().__init__()
        self.declared = declared

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if str(request.url) != TOKEN_ENDPOINT:
            return super().handle(request)
        self.requests.append(request)
        body = json.dumps({"access_token": "A" * 70_000, "token_type": "Bearer"}).encode()
        if self.declared:
            return httpx2.Response(200, content=body, headers={"Content-Type": "application/json"})

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 4096):
                yield body[start : start + 4096]

        return httpx2.Response(200, stream=_Chunked(chunks()), headers={"Content-Type": "application/json"})


class _Chunked(httpx2.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            yield chunk


@pytest.mark.parametrize("declared", [True, False])
async def test_a_token_answer_over_64_kib_is_refused_and_nothing_is_stored(tmp_path: Path, declared: bool) -> None:
    server = _HugeTokenAs(declared=declared)
    with pytest.raises(AuthorizationRefused, match="larger than 65536 bytes"):
        await _sign_in(tmp_path, server, _Browser(iss=ISSUER))
    assert TOKEN_ENDPOINT in server.urls()  # it was asked, and its answer dropped
    storage = CredentialTokenStorage(open_store(tmp_path), connector="pkg", account="default")
    assert await storage.get_tokens() is None and await storage.get_client_info() is None


async def test_token_requests_ask_for_no_compression_and_a_compressed_answer_is_refused(tmp_path: Path) -> None:
    class Gzipping(_ProviderAs):
        def handle(self, request: httpx2.Request) -> httpx2.Response:
            if str(request.url) != TOKEN_ENDPOINT:
                return super().handle(request)
            self.requests.append(request)
            body = gzip.compress(json.dumps({"access_token": "A" * 1_000_000, "token_type": "Bearer"}).encode())
            return httpx2.Response(200, content=body, headers={"Content-Encoding": "gzip"})

    server = Gzipping()
    with pytest.raises(AuthorizationRefused, match="or compressed"):
        await _sign_in(tmp_path, server, _Browser(iss=ISSUER))
    assert server.requests[-1].headers["accept-encoding"] == "identity"


async def test_a_grant_wider_than_asked_is_kept_and_shown_as_such(tmp_path: Path) -> None:
    class Generous(_ProviderAs):
        def handle(self, request: httpx2.Request) -> httpx2.Response:
            if str(request.url) != TOKEN_ENDPOINT:
                return super().handle(request)
            self.requests.append(request)
            body = {"access_token": "at-1", "token_type": "Bearer", "scope": "repo read:user delete_repo"}
            return httpx2.Response(200, json=body)

    storage = CredentialTokenStorage(open_store(tmp_path), connector="pkg", account="default")
    provider = ProviderClient("pkg", "client-1", issuer=ISSUER, scopes=("repo", "read:user"))
    transport = httpx2.MockTransport(Generous().handle)
    await sign_in(
        provider, storage=storage, driver=_Browser(iss=ISSUER), redirect_uri=REDIRECT_URI, transport=transport
    )
    keeper = GrantKeeper("pkg", storage, audit=lambda event, **fields: None)
    await keeper.load()
    shown = keeper.public()
    assert shown["granted_scopes"] == ["repo", "read:user", "delete_repo"]
    assert shown["granted_beyond_asked"] == ["delete_repo"]


async def test_a_grant_that_names_no_scope_is_what_was_asked(tmp_path: Path) -> None:
    storage = await _sign_in(tmp_path, _ProviderAs(), _Browser(iss=ISSUER))
    grant = await storage.current()
    assert grant is not None and grant.granted_scopes() == [] and grant.beyond_asked() == []
