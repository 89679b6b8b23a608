"""A package's ``oauth-client.json`` as a pydantic model: the provider it signs in to and the upstream it may reach.

```json
{
  "issuer": "https://auth.example.com",
  "client_id": "Iv1.abc",
  "scopes": ["repo"],
  "authorize_params": {"access_type": "offline", "prompt": "consent"},
  "upstream": {"base_url": "https://api.example.com", "paths": ["/repos/", "/search/"], "methods": ["GET", "POST"]}
}
```

The authorization server is given one way: ``issuer`` (RFC 8414 / OpenID discovery), ``metadata_url``
(its metadata document), or ``authorization_endpoint`` + ``token_endpoint`` (+ ``revocation_endpoint``).
``client_id`` may be left out when every user registers their own client (GitHub's OAuth apps): then
``sidecar connectors connect <id> --client-id`` gives it. A client *secret* is never in the package
(``--client-secret-file`` at sign-in, kept in the credential store). ``pkce: false`` says the provider
has no PKCE (S256 is required otherwise; ``connectors show`` says so). ``upstream`` is everything the
internal API (contract §7) will forward to: one origin, path prefixes and methods; nothing else.

Strict like every manifest: unknown keys, plain http to a non-loopback host and non-http(s) schemes are
errors naming the file and the field.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sidecar.connectors.manifest.fields import ABSENT, GIVEN, ApiBaseUrl, ClientSecret, ScopeToken, Text, Url
from sidecar.oauth.declared import Provider, UpstreamApi
from sidecar.oauth.forward import FORBIDDEN_HEADER_PREFIXES, FORBIDDEN_HEADERS

__all__ = ["METHODS", "OAuthClientFile", "UpstreamFile"]

METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
"""What an upstream may allow; never CONNECT, TRACE or OPTIONS (they are no API calls)."""
_PATH: Final = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:/-]*")  # RFC 3986 pchar without '%' and '@'
_PARAM: Final = re.compile(r"[A-Za-z0-9._~-]{1,64}")
_HEADER: Final = re.compile(r"[Xx]-[A-Za-z0-9-]{1,62}")
_RESERVED_PARAMS: Final = frozenset(
    {
        "response_type",
        "client_id",
        "redirect_uri",
        "state",
        "scope",
        "code_challenge",
        "code_challenge_method",
        "resource",
        "iss",
    }
)
"""Authorize parameters sidecar sets itself; a package may not override them."""


def _path_prefix(value: str) -> str:
    if not _PATH.fullmatch(value):
        raise ValueError("must start with '/' and hold only unreserved URL characters (no '%', '@', '?', '#')")
    segments = value.split("/")[1:]
    if any(segment in (".", "..") for segment in segments) or "//" in value:
        raise ValueError("must not have '.' or '..' segments or an empty segment ('//')")
    return value


def _api_header(value: str) -> str:
    if not _HEADER.fullmatch(value):
        raise ValueError("must be an X- header name (letters, digits and '-')")
    lower = value.lower()
    if lower.startswith(FORBIDDEN_HEADER_PREFIXES) or lower in FORBIDDEN_HEADERS:
        raise ValueError(f"{value} may never go upstream (it is sidecar's own, or it rewrites the request)")
    return lower


def _authorize_params(params: dict[str, str]) -> dict[str, str]:
    for name, value in params.items():
        if not _PARAM.fullmatch(name):
            raise ValueError(f"{name[:64]!r} is not a plain parameter name")
        if name in _RESERVED_PARAMS:
            raise ValueError(f"{name!r} is set by sidecar itself and cannot be overridden")
        if not _PARAM.fullmatch(value):
            raise ValueError(f"the value of {name!r} must be a short plain word")
    return params


PathPrefix = Annotated[str, AfterValidator(_path_prefix)]
ApiHeader = Annotated[str, AfterValidator(_api_header)]
Method = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True)


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("lists an item twice")
    return values


class UpstreamFile(_Model):
    """The upstream API the internal API forwards to: its origin and path, and what may be asked of it."""

    base_url: ApiBaseUrl
    """``https://`` (or ``http://`` to loopback) origin, optionally with a path every request goes under."""
    paths: Annotated[list[PathPrefix], Field(min_length=1), AfterValidator(_distinct)]
    """Path prefixes (under ``base_url``'s path) a request may name; ``"/"`` allows every path."""
    methods: Annotated[list[Method], Field(min_length=1), AfterValidator(_distinct)]
    headers: Annotated[list[ApiHeader], Field(max_length=16), AfterValidator(_distinct)] = []
    """``X-`` request headers the package's requests send upstream (say ``X-GitHub-Api-Version``)."""

    @field_validator("base_url")
    @classmethod
    def _plain_origin_and_path(cls, value: str) -> str:
        parts = urlsplit(value)
        if "%" in parts.path or "@" in parts.path or any(s in (".", "..") for s in parts.path.split("/")):
            raise ValueError("its path must be plain: no '%', '@', '.' or '..'")
        return value


class OAuthClientFile(_Model):
    """A package's ``oauth-client.json`` (module docstring)."""

    client_secret: ClientSecret = Field(default=None, exclude=True)
    """Refused whenever present; its value is never read nor repeated."""
    schema_: Any = Field(default=None, alias="$schema", exclude=True)
    issuer: Annotated[Url | None, GIVEN] = None
    """The authorization server's issuer: its metadata is discovered (RFC 8414, then OpenID)."""
    metadata_url: Annotated[Url | None, GIVEN] = None
    authorization_endpoint: Annotated[Url | None, GIVEN] = Field(default=ABSENT, validate_default=True)
    token_endpoint: Annotated[Url | None, GIVEN] = Field(default=ABSENT, validate_default=True)
    revocation_endpoint: Annotated[Url | None, GIVEN] = None
    resource: Annotated[Url | None, GIVEN] = None
    """An RFC 8707 resource indicator sent with the authorization and token requests."""
    client_id: Annotated[Text | None, GIVEN] = None
    """The registered client; left out when each user registers their own (``connect --client-id``)."""
    scopes: list[ScopeToken] = Field(default_factory=list)
    authorize_params: Annotated[dict[str, str], AfterValidator(_authorize_params)] = Field(default_factory=dict)
    """Extra authorization request parameters (Google's ``access_type=offline``, ``prompt=consent``)."""
    pkce: bool = True
    """``false`` only for a provider without PKCE: sign-in then relies on ``state`` alone (shown as such)."""
    upstream: UpstreamFile

    @field_validator("metadata_url")
    @classmethod
    def _one_discovery(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("issuer") is not None:
            raise ValueError("give either issuer or metadata_url, not both")
        return value

    @field_validator("authorization_endpoint", "token_endpoint")
    @classmethod
    def _endpoints_or_discovery(cls, value: str | None, info: ValidationInfo) -> str | None:
        if "metadata_url" not in info.data or "issuer" not in info.data:
            return value  # the discovery key itself is wrong; its problem is the one to read
        discovered = info.data["metadata_url"] is not None or info.data["issuer"] is not None
        if value is not None and discovered:
            raise ValueError("give either issuer (or metadata_url) or authorization_endpoint + token_endpoint")
        if value is None and not discovered:
            raise ValueError("missing (or give issuer for RFC 8414 discovery)")
        return value

    def declared(self) -> Provider:
        """The file as the OAuth side takes it: frozen, typed, the secret never in it."""
        upstream = self.upstream
        return Provider(
            upstream=UpstreamApi(
                upstream.base_url, tuple(upstream.paths), tuple(upstream.methods), tuple(upstream.headers)
            ),
            issuer=self.issuer,
            metadata_url=self.metadata_url,
            authorization_endpoint=self.authorization_endpoint,
            token_endpoint=self.token_endpoint,
            revocation_endpoint=self.revocation_endpoint,
            resource=self.resource,
            client_id=self.client_id,
            scopes=tuple(self.scopes),
            authorize_params=MappingProxyType(dict(self.authorize_params)),
            pkce=self.pkce,
        )
