"""An ``OAuthClientProvider`` for a remote MCP server, on our storage, with a swappable authorization driver.

The SDK's provider does discovery (RFC 9728, RFC 8414/OIDC), registration (pre-registered, CIMD,
DCR), PKCE S256, ``resource`` (RFC 8707), scope selection and step-up, the RFC 9207 ``iss`` check and
refresh. Around it this module adds:

- **the driver**, which takes the authorization URL to a code: ``HeadlessDriver`` fetches it itself
  (the conformance suite's mock AS answers at once with a redirect); the daemon's driver will open the
  browser and wait for its ``/oauth/callback`` (not built yet);
- **the S256 rule** the SDK does not enforce. The 2025-11-25 spec (§"Authorization Code Protection"):
  if ``code_challenge_methods_supported`` is absent the client MUST refuse to proceed, and S256 is the
  method we send. The SDK hands the authorization URL to its ``redirect_handler`` after discovery and
  registration and before anything reaches the authorization endpoint; our handler checks the AS
  metadata the provider discovered there and raises ``AuthorizationRefused`` before the driver runs.
  A server with no metadata at all (the 2025-03-26 fallback to ``/authorize`` on its own origin, which
  that spec allowed) has nothing to check and is let through: there is no list to lack S256. The same
  check runs as a request hook (``s256_guard``) on the provider's HTTP client, so nothing, not even a
  dynamic registration, reaches an AS whose metadata lacks S256;
- **a check of the authorization URL** before any driver sees it (the spec's security best practices):
  https, or http on loopback only; never ``javascript:``, ``data:``, ``file:``;
- **extra scope**: the SDK sets the client's ``scope`` from the server's 401 challenge (or its
  metadata) just before it registers and authorizes; scopes the user configured and scopes a call was
  refused for (``stepup``) must be asked for too, so the client metadata here keeps them in ``scope``
  whatever the SDK assigns (``_WidenedMetadata``), in the registration and the authorization URL alike.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth.oauth2 import OAuthClientProvider, OAuthContext
from mcp.client.auth.utils import union_scopes
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata, OAuthMetadata
from pydantic import AnyUrl, ConfigDict, PrivateAttr, model_validator

from sidecar.errors import AuthorizationRefused
from sidecar.oauth.sdk_context import discovered
from sidecar.oauth.storage import CredentialTokenStorage
from sidecar.origins import is_loopback_host

__all__ = [
    "PKCE_METHOD",
    "AuthorizationDriver",
    "AuthorizationRefused",
    "HeadlessDriver",
    "build_provider",
    "check_authorization_url",
    "client_metadata",
    "require_s256",
    "s256_guard",
]

logger = logging.getLogger(__name__)

PKCE_METHOD: Final = "S256"
AUTHORIZE_TIMEOUT: Final = 30.0
"""Seconds the headless driver waits for the authorization endpoint's redirect."""


class AuthorizationDriver(Protocol):
    """Takes a user through the authorization URL and returns what came back on the redirect URI."""

    async def authorize(self, url: str) -> AuthorizationCodeResult: ...


class HeadlessDriver:
    """GET the authorization URL with redirects off and read ``code``, ``state`` and ``iss`` from ``Location``.

    For authorization servers that approve without a person (the conformance suite's mock AS, test
    servers). Nothing listens on the redirect URI: the redirect itself is the answer.
    """

    def __init__(
        self, *, timeout: float = AUTHORIZE_TIMEOUT, transport: httpx2.AsyncBaseTransport | None = None
    ) -> None:
        self._timeout = timeout
        self._transport = transport  # tests: an in-memory AS

    async def authorize(self, url: str) -> AuthorizationCodeResult:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=self._timeout, transport=self._transport) as http:
            response = await http.get(url)
        location = response.headers.get("location")
        if not response.has_redirect_location or not location:
            raise AuthorizationRefused(f"the authorization endpoint answered {response.status_code} without a redirect")
        query = parse_qs(urlsplit(location).query)
        code, state, iss = (query.get(name, [None])[0] for name in ("code", "state", "iss"))
        if not code:
            # RFC 6749 §4.1.2.1 error codes are short ASCII words; anything else is not repeated.
            error = query.get("error", ["no code"])[0]
            raise AuthorizationRefused(f"the authorization server gave no code ({error[:64]!r})")
        return AuthorizationCodeResult(code=code, state=state, iss=iss)


def require_s256(metadata: OAuthMetadata | None) -> None:
    """Refuse AS metadata that does not advertise S256 PKCE (spec 2025-11-25 §"Authorization Code Protection").

    ``None`` (no metadata discovered: the 2025-03-26 default-endpoint fallback) passes; see the module.
    """
    if metadata is None:
        return
    methods = metadata.code_challenge_methods_supported
    if not methods or PKCE_METHOD not in methods:
        # SECURITY: without S256 advertised the AS may ignore PKCE, leaving an intercepted code usable.
        raise AuthorizationRefused(
            f"the authorization server {metadata.issuer} does not advertise PKCE {PKCE_METHOD} "
            f"(code_challenge_methods_supported: {methods!r}); sidecar will not sign in there"
        )


def s256_guard(provider: OAuthClientProvider) -> Callable[[httpx2.Request], Awaitable[None]]:
    """An httpx request hook that sends nothing more once the provider has discovered AS metadata without
    S256: the redirect handler's check comes after registration, this one before it."""

    async def check(request: httpx2.Request) -> None:
        require_s256(discovered(provider.context).authorization_server)

    return check


def check_authorization_url(url: str) -> None:
    """Only https, or http to a loopback host, may be opened (spec: security best practices)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return
    if parts.scheme == "http" and is_loopback_host(host):
        return
    # SECURITY: never hand a browser javascript:, data:, file: or plain http to another host.
    raise AuthorizationRefused(f"refusing the authorization URL scheme/host {parts.scheme!r}/{host!r}")


class _Authorizer:
    """The provider's ``redirect_handler`` and ``callback_handler``: check, then run the driver once."""

    def __init__(self, driver: AuthorizationDriver) -> None:
        self._driver = driver
        self._context: OAuthContext | None = None
        self._result: AuthorizationCodeResult | None = None

    def bind(self, context: OAuthContext) -> None:
        self._context = context

    async def redirect(self, url: str) -> None:
        self._result = None
        if self._context is None:
            raise AuthorizationRefused("the provider was not bound to its authorizer")
        require_s256(discovered(self._context).authorization_server)
        check_authorization_url(url)
        self._result = await self._driver.authorize(url)

    async def callback(self) -> AuthorizationCodeResult:
        result, self._result = self._result, None
        if result is None:
            raise AuthorizationRefused("no authorization result: the redirect step did not complete")
        return result


class _WidenedMetadata(OAuthClientMetadata):
    """Client metadata whose ``scope``, however it is assigned, includes the extra scope it was made with."""

    model_config = ConfigDict(validate_assignment=True)
    _extra: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _widen(self) -> _WidenedMetadata:
        extra = getattr(self, "_extra", None)  # unset while the model itself is being built
        if extra:
            self.__dict__["scope"] = union_scopes(self.__dict__.get("scope"), extra)  # no re-validation loop
        return self


def client_metadata(
    redirect_uri: str, *, client_name: str = "sidecar", extra_scope: str | None = None
) -> OAuthClientMetadata:
    """What we register as: a native public client that wants refresh tokens (spec 2026-07-28 "Refresh
    Tokens"), asking for ``extra_scope`` beside whatever scope the server's challenge names."""
    metadata = _WidenedMetadata(
        client_name=client_name,
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    metadata._extra = extra_scope
    metadata.scope = extra_scope
    return metadata


def build_provider(
    server_url: str,
    *,
    storage: CredentialTokenStorage,
    driver: AuthorizationDriver,
    redirect_uri: str,
    client_name: str = "sidecar",
    client_metadata_url: str | None = None,
    extra_scope: str | None = None,
) -> OAuthClientProvider:
    """An ``httpx2.Auth`` for ``server_url`` that keeps its grant in ``storage`` and authorizes with ``driver``;
    ``extra_scope`` is asked for beside the server's own challenge."""
    authorizer = _Authorizer(driver)
    provider = OAuthClientProvider(
        server_url=server_url,
        client_metadata=client_metadata(redirect_uri, client_name=client_name, extra_scope=extra_scope),
        storage=storage,
        redirect_handler=authorizer.redirect,
        callback_handler=authorizer.callback,
        client_metadata_url=client_metadata_url,
    )
    authorizer.bind(provider.context)
    storage.bind(provider.context)
    return provider
