"""Pins the SDK internals ``sidecar.oauth.sdk_context`` relies on, and the SDK gap it closes (python-sdk#3250).

If the first tests fail after an SDK upgrade, the fields moved: fix ``sdk_context``. If the last one
fails, the SDK restores expiry and metadata itself: delete ``sdk_context`` and its callers.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from pathlib import Path

import httpx2
import pytest
from mcp.client.auth.oauth2 import OAuthClientProvider, OAuthContext
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from pydantic import AnyUrl

from sidecar.oauth.sdk_context import Discovered, discovered, restore
from sidecar.oauth.storage import CredentialTokenStorage
from tests.oauth.fakes import ISSUER, MCP_URL, REDIRECT_URI, TOKEN_ENDPOINT, FakeServers, open_store

AS_METADATA = OAuthMetadata.model_validate(FakeServers().metadata())
PRM = ProtectedResourceMetadata.model_validate({"resource": MCP_URL, "authorization_servers": [ISSUER]})


def _provider(storage: object) -> OAuthClientProvider:
    metadata = OAuthClientMetadata(redirect_uris=[AnyUrl(REDIRECT_URI)])
    return OAuthClientProvider(MCP_URL, metadata, storage)  # type: ignore[arg-type]


def test_the_context_still_has_the_fields_we_seed() -> None:
    assert dataclasses.is_dataclass(OAuthContext)
    hints = typing.get_type_hints(OAuthContext)
    assert hints["token_expiry_time"] == float | None
    assert hints["oauth_metadata"] == OAuthMetadata | None
    assert hints["protected_resource_metadata"] == ProtectedResourceMetadata | None


async def test_a_restored_context_refreshes_an_expired_token_at_the_discovered_endpoint() -> None:
    context = _provider(None).context
    restore(context, expires_at=time.time() - 1, metadata=Discovered(AS_METADATA, PRM))
    context.current_tokens = OAuthToken(access_token="old", refresh_token="rt")
    context.client_info = OAuthClientInformationFull(client_id="client-1", redirect_uris=[AnyUrl(REDIRECT_URI)])
    assert not context.is_token_valid() and context.can_refresh_token()
    assert discovered(context) == Discovered(AS_METADATA, PRM)
    provider = _provider(None)
    provider.context = context
    request = await provider._refresh_token()  # what the next request's auth flow sends first
    assert str(request.url) == TOKEN_ENDPOINT
    assert b"resource=https%3A%2F%2Fmcp.example%2Fmcp" in request.content


def test_restore_replaces_the_expiry_but_never_a_fresher_discovery() -> None:
    context = _provider(None).context
    newer = OAuthMetadata.model_validate({**FakeServers().metadata(), "token_endpoint": f"{ISSUER}/v2/token"})
    context.oauth_metadata = newer
    context.token_expiry_time = 1.0
    restore(context, expires_at=2.0, metadata=Discovered(AS_METADATA, PRM))
    assert context.token_expiry_time == 2.0
    assert context.oauth_metadata is newer
    assert context.protected_resource_metadata == PRM


class _Asked:
    asked = False

    async def redirect(self, url: str) -> None:
        self.asked = True

    async def callback(self) -> AuthorizationCodeResult:
        raise RuntimeError("stop here: the SDK went interactive")


async def test_the_sdk_alone_still_goes_interactive_after_a_restart(data_dir: Path, servers: FakeServers) -> None:
    """Our storage, unbound (so nothing is restored): the SDK 2.3.0 behaviour of python-sdk#3250."""
    storage = CredentialTokenStorage(open_store(data_dir), connector="remote", account="me")
    await storage.set_client_info(
        OAuthClientInformationFull(client_id="client-1", redirect_uris=[AnyUrl(REDIRECT_URI)], issuer=ISSUER)
    )
    servers.valid = "at-new"  # the stored access token has expired
    await storage.set_tokens(OAuthToken(access_token="at-old", refresh_token="rt-1", expires_in=1))

    asked = _Asked()
    provider = OAuthClientProvider(
        MCP_URL,
        OAuthClientMetadata(redirect_uris=[AnyUrl(REDIRECT_URI)]),
        CredentialTokenStorage(open_store(data_dir), connector="remote", account="me"),
        redirect_handler=asked.redirect,
        callback_handler=asked.callback,
    )
    async with httpx2.AsyncClient(auth=provider, transport=servers.transport()) as http:
        with pytest.raises(RuntimeError, match="went interactive"):
            await http.post(MCP_URL, json={})
    assert asked.asked, "the SDK refreshed on its own: delete sidecar.oauth.sdk_context"
    assert servers.token_requests() == []  # the refresh token was never used
