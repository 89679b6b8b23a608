"""What a connector's configuration says about OAuth, as plain frozen values the broker can take.

The connectors' manifests validate the files and build these (``connectors.manifest.oauth_client``,
``connectors.manifest.sources``); the OAuth side reads them and knows nothing of connectors:

- ``OAuthClient``: an HTTP entry's ``"oauth"`` block in ``mcp.json``, the client to sign in to a remote
  MCP server as (its secret stays in its file until a sign-in reads it);
- ``PreRegistered``: the client it stands for once its secret is read (how the broker signs in as it);
- ``Provider``: a package's ``oauth-client.json``, the provider it signs in to and the ``upstream`` API
  the internal API may forward its requests to (``UpstreamApi``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

__all__ = ["OAuthClient", "PreRegistered", "Provider", "UpstreamApi"]


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """A pre-registered OAuth client of a remote server (an HTTP entry's ``oauth``); the secret stays in its file."""

    client_id: str
    """The registered client's id, or (``metadata_document``) the URL of its Client ID Metadata Document."""
    secret_file: Path | None
    scopes: tuple[str, ...]
    metadata_document: bool = False


@dataclass(frozen=True, slots=True)
class PreRegistered:
    """How the user's ``"oauth"`` entry says sidecar is known to the AS, instead of registering there: a
    client registered beforehand, or (``metadata_document``) a Client ID Metadata Document whose URL is
    the client id, used where the AS supports those (the SDK registers dynamically elsewhere)."""

    client_id: str
    client_secret: str | None = None
    scopes: tuple[str, ...] = ()
    metadata_document: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamApi:
    """The API a package's processes reach through the internal API (``oauth-client.json``'s ``upstream``)."""

    base_url: str
    """``https://`` (or ``http://`` to loopback) origin, optionally with a path every request goes under."""
    paths: tuple[str, ...]
    """Path prefixes (under ``base_url``'s path) a request may name; ``"/"`` allows every path."""
    methods: tuple[str, ...]
    headers: tuple[str, ...] = ()
    """``X-`` request headers the package's requests may carry upstream, lowercase, beyond the standard few."""


@dataclass(frozen=True, slots=True)
class Provider:
    """A package's OAuth provider and its upstream API, as its validated ``oauth-client.json`` declares them.

    The authorization server is given one way: ``issuer`` (discovered), ``metadata_url``, or
    ``authorization_endpoint`` + ``token_endpoint`` (+ ``revocation_endpoint``)."""

    upstream: UpstreamApi
    issuer: str | None = None
    metadata_url: str | None = None
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    revocation_endpoint: str | None = None
    resource: str | None = None
    """An RFC 8707 resource indicator sent with the authorization and token requests."""
    client_id: str | None = None
    """The registered client; ``None`` when each user registers their own (``connect --client-id``)."""
    scopes: tuple[str, ...] = ()
    authorize_params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra authorization request parameters (Google's ``access_type=offline``, ``prompt=consent``)."""
    pkce: bool = True
    """``False`` only for a provider without PKCE: sign-in then relies on ``state`` alone."""
