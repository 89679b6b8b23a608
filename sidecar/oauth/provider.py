"""Sign-in to a package's OAuth provider (``oauth-client.json``): authorization code + PKCE S256, no MCP in sight.

A remote MCP server tells the SDK's provider where its AS is (RFC 9728); a REST API such as GitHub's
does not, so a package declares its provider and this module runs the same flow by hand, with the same
rules as part 1 (``flow``): the AS metadata is discovered from ``issuer`` (RFC 8414, then OpenID, the
``issuer`` in the document must be the one asked for) or read from ``metadata_url``, or built from the
declared endpoints; S256 must be advertised unless the package says the provider has no PKCE; the
authorization URL must be https (or loopback http); ``state`` is 256 random bits and single use (the
broker matches the callback by it); a present ``iss`` (RFC 9207 §2.4) must equal the issuer by simple
string comparison, and one the AS promised (``authorization_response_iss_parameter_supported``) must be
present. The code goes to the token endpoint with the verifier and the client's authentication (its
secret, when the user gave one); the grant, with the AS metadata the refresh and the revocation need,
goes to the credential store. A refused response stores nothing.

The discovery URLs, the metadata ``issuer`` check, PKCE and the ``iss`` check are the SDK's own public
helpers (``mcp.client.auth.utils``, ``PKCEParameters``), the ones its provider runs for remote servers.

Nothing here logs or returns a token, a code, a verifier or a secret.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import httpx2
from mcp.client.auth import OAuthFlowError, PKCEParameters
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    validate_authorization_response_iss,
    validate_metadata_issuer,
)
from mcp.shared.auth import OAuthMetadata, OAuthToken
from pydantic import AnyUrl, ValidationError

from sidecar.errors import AuthorizationRefused
from sidecar.oauth.capped import TokenCap, token_endpoint_failure
from sidecar.oauth.declared import Provider
from sidecar.oauth.flow import PKCE_METHOD, AuthorizationDriver, check_authorization_url, require_s256
from sidecar.oauth.grant import client_auth
from sidecar.oauth.storage import CredentialTokenStorage, StoredGrant, registered_client

__all__ = ["ProviderClient", "discover", "sign_in"]

HTTP_TIMEOUT: Final = 30.0
_MAX_DOCUMENT: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class ProviderClient:
    """A package's provider and the client the user signs in as (the secret from their file, if any)."""

    connector_id: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    scopes: tuple[str, ...] = ()
    authorize_params: Mapping[str, str] = field(default_factory=dict)
    pkce: bool = True
    issuer: str | None = None
    metadata_url: str | None = None
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    revocation_endpoint: str | None = None
    resource: str | None = None

    @classmethod
    def of(
        cls, connector_id: str, provider: Provider, *, client_id: str | None, client_secret: str | None
    ) -> ProviderClient:
        """From a package's declared provider (``ConnectorSpec.oauth``) and what the user supplied."""
        chosen = client_id or provider.client_id
        if not chosen:
            raise AuthorizationRefused(
                f"connector {connector_id} names no OAuth client: register one with the provider and run "
                f"sidecar connectors connect {connector_id} --client-id <id>"
            )
        return cls(
            connector_id,
            chosen,
            client_secret,
            provider.scopes,
            dict(provider.authorize_params),
            provider.pkce,
            issuer=provider.issuer,
            metadata_url=provider.metadata_url,
            authorization_endpoint=provider.authorization_endpoint,
            token_endpoint=provider.token_endpoint,
            revocation_endpoint=provider.revocation_endpoint,
            resource=provider.resource,
        )


async def _document(http: httpx2.AsyncClient, url: str) -> dict[str, Any] | None:
    response = await http.get(url, headers={"Accept": "application/json"})
    if response.status_code != 200 or len(response.content) > _MAX_DOCUMENT:
        return None
    try:
        data = json.loads(response.content)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


async def discover(provider: ProviderClient, http: httpx2.AsyncClient) -> OAuthMetadata:
    """The AS metadata: discovered, read, or built from the declared endpoints."""
    if provider.authorization_endpoint is not None and provider.token_endpoint is not None:
        parts = urlsplit(provider.authorization_endpoint)
        return OAuthMetadata(
            issuer=AnyUrl(f"{parts.scheme}://{parts.netloc}"),  # type: ignore[arg-type]
            authorization_endpoint=provider.authorization_endpoint,  # type: ignore[arg-type]
            token_endpoint=provider.token_endpoint,  # type: ignore[arg-type]
            revocation_endpoint=provider.revocation_endpoint,  # type: ignore[arg-type]
            response_types_supported=["code"],
            code_challenge_methods_supported=[PKCE_METHOD] if provider.pkce else None,
        )
    if provider.issuer is not None:
        # RFC 8414 §3.1 (path inserted after the well-known prefix), then OpenID Connect Discovery §4.
        urls = build_oauth_authorization_server_metadata_discovery_urls(provider.issuer, provider.issuer)
    elif provider.metadata_url is not None:
        urls = [provider.metadata_url]
    else:
        raise AuthorizationRefused(f"connector {provider.connector_id} declares no authorization server")
    for url in urls:
        data = await _document(http, url)
        if data is None:
            continue
        try:
            metadata = OAuthMetadata.model_validate(data)
        except ValidationError:
            raise AuthorizationRefused(f"the metadata at {url} is not RFC 8414 metadata") from None
        _check_issuer(metadata, data.get("issuer"), provider.issuer, url)
        return metadata
    raise AuthorizationRefused(f"no authorization server metadata found for {provider.connector_id}")


def _check_issuer(metadata: OAuthMetadata, written: object, expected: str | None, url: str) -> None:
    """RFC 8414 §3.3: the document names the issuer it was asked for, exactly.

    ``written`` must also be the parsed ``issuer`` unchanged: every later comparison (the ``iss`` of
    RFC 9207, the grant's issuer) is against ``metadata.issuer``, so it must be the AS's own string, not
    one the URL parser normalised (case, default port)."""
    # SECURITY: simple string comparison (RFC 3986 §6.2.1), no normalisation; a mix-up defence.
    if written != str(metadata.issuer):
        raise AuthorizationRefused(f"the metadata at {url} names its issuer in a non-canonical form; refused")
    if expected is not None:
        try:
            validate_metadata_issuer(metadata, expected)
        except OAuthFlowError:
            raise AuthorizationRefused(f"the metadata at {url} names another issuer; sidecar will not use it") from None


def authorization_url(
    provider: ProviderClient, metadata: OAuthMetadata, *, redirect_uri: str, state: str, challenge: str | None
) -> str:
    params: dict[str, str] = dict(provider.authorize_params)
    params.update({"response_type": "code", "client_id": provider.client_id, "redirect_uri": redirect_uri})
    params["state"] = state
    if provider.scopes:
        params["scope"] = " ".join(provider.scopes)
    if challenge is not None:
        params.update({"code_challenge": challenge, "code_challenge_method": PKCE_METHOD})
    if provider.resource is not None:
        params["resource"] = provider.resource
    endpoint = str(metadata.authorization_endpoint)
    return endpoint + ("&" if "?" in endpoint else "?") + urlencode(params)


def _check_iss(metadata: OAuthMetadata, iss: str | None) -> None:
    """RFC 9207 §2.4, as the 2026-07-28 spec tables it: a present ``iss`` must equal the issuer by simple
    string comparison; one the AS promised must be present."""
    try:
        validate_authorization_response_iss(iss, metadata)
    except OAuthFlowError:
        # SECURITY: a response from another AS (mix-up, RFC 9207 §1) is not acted on, its code not redeemed.
        if iss is None:
            why = "the authorization response lacks the iss its server promised (RFC 9207)"
        else:
            why = "the authorization response names another issuer (RFC 9207); refused"
        raise AuthorizationRefused(why) from None


async def sign_in(
    provider: ProviderClient,
    *,
    storage: CredentialTokenStorage,
    driver: AuthorizationDriver,
    redirect_uri: str,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> StoredGrant:
    """Run the whole flow; the grant is stored when it returns. ``AuthorizationRefused`` otherwise."""
    async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT, transport=TokenCap(transport), follow_redirects=False) as http:
        metadata = await discover(provider, http)
        if provider.pkce:
            require_s256(metadata)
        pkce = PKCEParameters.generate() if provider.pkce else None  # RFC 7636 §4.1, §4.2: S256
        state = secrets.token_urlsafe(32)
        challenge = pkce.code_challenge if pkce is not None else None
        url = authorization_url(provider, metadata, redirect_uri=redirect_uri, state=state, challenge=challenge)
        check_authorization_url(url)
        result = await driver.authorize(url)
        if result.state != state:
            raise AuthorizationRefused("the authorization response carries another state; refused")
        _check_iss(metadata, result.iss)
        issuer = str(metadata.issuer)
        client = registered_client(
            provider.client_id, provider.client_secret, redirect_uri=redirect_uri, scopes=provider.scopes, issuer=issuer
        )
        form = {"grant_type": "authorization_code", "code": result.code, "redirect_uri": redirect_uri}
        if pkce is not None:
            form["code_verifier"] = pkce.code_verifier
        if provider.resource is not None:
            form["resource"] = provider.resource
        data, headers = client_auth(StoredGrant(client=client), form)
        try:
            response = await http.post(str(metadata.token_endpoint), data=data, headers=headers)
        except httpx2.HTTPError as exc:
            raise AuthorizationRefused(token_endpoint_failure(exc)) from None
    try:
        tokens = OAuthToken.model_validate_json(response.content) if response.status_code == 200 else None
    except ValidationError:
        tokens = None
    if tokens is None:
        raise AuthorizationRefused(f"the token endpoint refused the code (HTTP {response.status_code})")
    return await storage.save_sign_in(issuer, client=client, tokens=tokens, authorization_server=metadata)
