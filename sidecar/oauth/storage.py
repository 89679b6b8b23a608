"""The SDK's ``TokenStorage`` over the encrypted ``CredentialStore``: one record per (connector, account, issuer).

A record is one grant at one authorization server: the client registration made there, the tokens it
issued, their **absolute** expiry, and the metadata discovered on the way (the AS's and the protected
resource's). The SDK hands tokens over with a relative ``expires_in`` and reloads neither the expiry
nor the metadata, so a restart could never refresh silently (python-sdk#3250); this adapter saves all
of it and, when the provider loads the tokens again, seeds the provider through ``sdk_context.restore``.

Which issuer a record is filed under:

- tokens: the issuer of the AS metadata the provider discovered; else the registration's issuer;
  else the resource server's origin (the 2025-03-26 fallback, where the server is its own AS);
- a client registration: its own ``issuer`` (the SDK stamps it, SEP-2352); else as for tokens.

Registrations are therefore kept per AS: when a server moves to another AS, the new registration and
its tokens go to a new record and the old AS's record is left as it was. On load, the most recently
written record of the (connector, account) is the current one.

**Generations** (issue 24): an adapter writes for the grant generation it started from (the store's,
read when it is made, or passed in by a sign-in that began earlier); ``current`` re-reads and adopts
the generation of now. A write for a grant revoked since is refused (``StaleGrant``), and the tokens it
would have stored go to ``discarded``, whose job is to revoke them at the AS: nothing a revoke has
deleted is stored again, and nothing obtained meanwhile is left active.

The store is synchronous, so every call runs in a worker thread. Nothing here logs a token; messages
name the connector, the account and the issuer only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
from mcp.client.auth.oauth2 import OAuthContext
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken, ProtectedResourceMetadata
from pydantic import AnyUrl, BaseModel, ConfigDict, ValidationError

from sidecar.errors import StaleGrant, StorageError
from sidecar.oauth.declared import PreRegistered
from sidecar.oauth.sdk_context import Discovered, discovered, restore
from sidecar.store.credentials import CredentialStore, RecordId

__all__ = ["CredentialTokenStorage", "StoredGrant", "Superseded", "grants_in", "registered_client"]

logger = logging.getLogger(__name__)


def registered_client(
    client_id: str,
    secret: str | None,
    *,
    redirect_uri: str,
    scopes: tuple[str, ...] | list[str] = (),
    issuer: str | None = None,
) -> OAuthClientInformationFull:
    """The record of a client the user registered beforehand: confidential (HTTP Basic) with a secret,
    public without; authorization code with refresh; the daemon's own redirect URI."""
    return OAuthClientInformationFull(
        client_id=client_id,
        client_secret=secret,
        redirect_uris=[AnyUrl(redirect_uri)],
        token_endpoint_auth_method="client_secret_basic" if secret else "none",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        scope=" ".join(scopes) or None,
        issuer=issuer,
    )


SUPERSEDED_MAX = 20
"""Access tokens a refresh replaced that are kept to revoke (as many as one grant may request at once)."""


class Superseded(BaseModel):
    """An access token a refresh replaced before it expired: still valid at the AS until then."""

    access_token: str
    expires_at: float | None = None


class StoredGrant(BaseModel):
    """The secret of one record (sealed by the store as a whole)."""

    model_config = ConfigDict(extra="ignore")

    client: OAuthClientInformationFull | None = None
    tokens: OAuthToken | None = None
    expires_at: float | None = None
    """Epoch seconds when the access token expires; None when the AS gave no ``expires_in``."""
    authorization_server: OAuthMetadata | None = None
    protected_resource: ProtectedResourceMetadata | None = None
    saved_at: float = 0.0
    """When this record was last written: the newest record of a (connector, account) is the current one."""
    issued_at: float | None = None
    """Epoch seconds when the tokens were issued: with ``expires_at``, their lifetime (refresh ahead of expiry)."""
    superseded: list[Superseded] = []
    """Access tokens earlier refreshes replaced, not yet expired: a revoke ends them too (their refresh
    tokens were spent by the rotation)."""
    asked_scope: str | None = None
    """The scope the sign-in asked for (None: none in particular), to show a grant wider than that."""

    def granted_scopes(self) -> list[str]:
        """What the tokens were granted: as the AS said, else what was asked (RFC 6749 §5.1)."""
        scope = self.tokens.scope if self.tokens is not None else None
        return (scope or self.asked_scope or "").split()

    def beyond_asked(self) -> list[str]:
        """Granted scopes the sign-in did not ask for (none when it asked for none in particular)."""
        if self.asked_scope is None:
            return []
        asked = set(self.asked_scope.split())
        return [scope for scope in self.granted_scopes() if scope not in asked]


def grants_in(connector_id: str, secrets: list[dict[str, Any]]) -> list[StoredGrant]:
    """The records (deleted ones, say) that parse as grants: what may hold tokens to revoke."""
    grants = []
    for secret in secrets:
        try:
            grants.append(StoredGrant.model_validate(secret))
        except ValidationError:
            logger.warning("a deleted OAuth record of %s has an unknown shape; nothing in it is revoked", connector_id)
    return grants


class CredentialTokenStorage:
    """``mcp.client.auth.oauth2.TokenStorage`` for one (connector, account), bound to one provider.

    ``bind(provider.context)`` before the provider's first request: the adapter reads the metadata the
    provider discovered when tokens are saved, and restores it when they are loaded.
    """

    def __init__(
        self,
        store: CredentialStore,
        *,
        connector: str,
        account: str,
        clock: Callable[[], float] = time.time,
        fresh_sign_in: bool = False,
        scope_needed: str | None = None,
        generation: int | None = None,
        discarded: Callable[[StoredGrant], None] | None = None,
    ) -> None:
        """``fresh_sign_in``: hide the stored tokens from the provider, so it authorizes anew (a sign-in
        over an existing grant keeps that grant usable until the new tokens replace it).
        ``scope_needed``: a dynamically registered client whose registered ``scope`` lacks some of these
        is hidden too, so the provider registers again with them (an AS refuses scope a client was not
        registered for).
        ``generation``: the grant generation this adapter's work started from (default: the store's now).
        ``discarded``: told of a grant whose write was refused as stale and that holds tokens (to revoke them)."""
        self._store = store
        self._generation = store.generation(connector) if generation is None else generation
        self._discarded = discarded
        self._fresh = fresh_sign_in
        self._scope_needed = set(scope_needed.split()) if scope_needed else set()
        self.connector = connector
        self.account = account
        self._clock = clock
        self._context: OAuthContext | None = None
        self._grants: dict[str, StoredGrant] | None = None  # by issuer; loaded on first use
        self._current: str | None = None  # the issuer of the grant in use

    def bind(self, context: OAuthContext) -> None:
        self._context = context

    # -- TokenStorage ------------------------------------------------------------------------------

    async def get_tokens(self) -> OAuthToken | None:
        grant = await self._current_grant()
        if grant is None or grant.tokens is None or self._fresh:
            return None
        if self._context is not None:
            # The provider is loading these tokens (``_initialize``): give it what it does not reload.
            restore(
                self._context,
                expires_at=grant.expires_at,
                metadata=Discovered(grant.authorization_server, grant.protected_resource),
            )
        return grant.tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        grant = await self._current_grant()
        client = None if grant is None else grant.client
        if client is not None and client.scope is not None and not self._scope_needed <= set(client.scope.split()):
            return None  # registered for less than this sign-in must ask for: register again
        return client

    async def seed_client(self, client: PreRegistered, *, redirect_uri: str) -> None:
        """Store a pre-registered client before the first request, which skips registration (the SDK's way)."""
        current = await self.get_client_info()
        given = (client.client_id, client.client_secret)
        if current is not None and (current.client_id, current.client_secret) == given:
            return
        await self.set_client_info(registered_client(*given, redirect_uri=redirect_uri, scopes=client.scopes))

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        grants = await self._loaded()
        issuer = client_info.issuer or self._discovered_issuer() or self._origin()
        old = grants.get(issuer)
        grant = StoredGrant(client=client_info, saved_at=self._clock(), **self._metadata())
        if old is not None and old.client is not None and old.client.client_id == client_info.client_id:
            # The same client again (re-registration echoed the id): its tokens stay valid.
            grant = grant.model_copy(update={"tokens": old.tokens, "expires_at": old.expires_at})
        await self._save(issuer, grant)

    async def set_tokens(self, tokens: OAuthToken) -> None:
        grants = await self._loaded()
        client = grants[self._current].client if self._current in grants else None
        issuer = self._discovered_issuer() or (client.issuer if client else None) or self._origin()
        now = self._clock()
        expires_at = None if tokens.expires_in is None else now + tokens.expires_in
        asked = self._context.client_metadata.scope if self._context is not None else None
        grant = StoredGrant(
            client=client,
            tokens=tokens,
            expires_at=expires_at,
            issued_at=now,
            saved_at=now,
            asked_scope=asked,
            **self._metadata(),
        )
        await self._save(issuer, grant)

    # -- for the broker, which holds the grant between sign-ins ------------------------------------

    async def current(self) -> StoredGrant | None:
        """The grant in use (re-read from the store: another instance may have written it). The adapter
        adopts the generation of now: later writes build on what this read found."""
        self._grants = None
        await self._loaded(adopt=True)
        return await self._current_grant()

    async def peek(self) -> StoredGrant | None:
        """The grant as stored now, read without adopting anything (the adapter's state is untouched)."""
        _, grants = await anyio.to_thread.run_sync(self._read)
        return grants[max(grants, key=lambda issuer: grants[issuer].saved_at)] if grants else None

    def stale(self) -> bool:
        """True when the grant was revoked since this adapter's generation: what it wrote went with the revoke."""
        return self._store.generation(self.connector) != self._generation

    async def save_sign_in(
        self,
        issuer: str,
        *,
        client: OAuthClientInformationFull,
        tokens: OAuthToken,
        authorization_server: OAuthMetadata,
    ) -> StoredGrant:
        """A whole grant from a sign-in run without the SDK's provider (a package's provider, ``oauth.provider``)."""
        await self._loaded()
        now = self._clock()
        expires_at = None if tokens.expires_in is None else now + tokens.expires_in
        grant = StoredGrant(
            client=client,
            tokens=tokens,
            expires_at=expires_at,
            issued_at=now,
            saved_at=now,
            authorization_server=authorization_server,
            asked_scope=client.scope,
        )
        await self._save(issuer, grant)
        return grant

    async def replace_tokens(self, tokens: OAuthToken) -> StoredGrant:
        """Save refreshed tokens into the current grant, keeping its issuer, client and metadata."""
        grants = await self._loaded()
        if self._current is None or self._current not in grants:
            raise StorageError(f"no OAuth grant of {self.connector} to refresh")
        now = self._clock()
        expires_at = None if tokens.expires_in is None else now + tokens.expires_in
        old = grants[self._current]
        alive = [s for s in old.superseded if s.expires_at is None or s.expires_at > now]
        replaced = old.tokens is not None and old.tokens.access_token != tokens.access_token
        if old.tokens is not None and replaced and (old.expires_at is None or old.expires_at > now):
            alive.append(Superseded(access_token=old.tokens.access_token, expires_at=old.expires_at))
        update = {"tokens": tokens, "expires_at": expires_at, "issued_at": now, "saved_at": now}
        grant = old.model_copy(update={**update, "superseded": alive[-SUPERSEDED_MAX:]})
        await self._save(self._current, grant)
        return grant

    async def clear_tokens(self) -> None:
        """Drop the current grant's tokens, keeping its client registration (a new sign-in reuses it)."""
        grants = await self._loaded()
        if self._current is None or self._current not in grants:
            return
        grant = grants[self._current].model_copy(
            update={"tokens": None, "expires_at": None, "issued_at": None, "saved_at": self._clock()}
        )
        with contextlib.suppress(StaleGrant):  # revoked meanwhile: the record went, and what this would keep
            await self._save(self._current, grant)

    # -- the records -------------------------------------------------------------------------------

    async def _current_grant(self) -> StoredGrant | None:
        grants = await self._loaded()
        return grants.get(self._current) if self._current is not None else None

    async def _loaded(self, *, adopt: bool = False) -> dict[str, StoredGrant]:
        if self._grants is None:
            generation, grants = await anyio.to_thread.run_sync(self._read)
            if adopt:
                self._generation = generation
            # else a read after a revoke is harmless: what the work then writes is refused (``_save``)
            if grants:
                self._current = max(grants, key=lambda issuer: grants[issuer].saved_at)
            self._grants = grants
        return self._grants

    def _read(self) -> tuple[int, dict[str, StoredGrant]]:
        grants = {}
        generation, found = self._store.snapshot(self.connector)
        for record, secret in found.items():
            if record.account != self.account:
                continue
            try:
                grants[record.issuer] = StoredGrant.model_validate(secret)
            except ValidationError:
                # A record of ours that no longer parses (an SDK model changed): a new sign-in replaces it.
                logger.warning(
                    "OAuth record of %s (%s at %s) is not in a known shape; it needs a new sign-in",
                    self.connector,
                    self.account,
                    record.issuer,
                )
        return generation, grants

    async def _save(self, issuer: str, grant: StoredGrant) -> None:
        record = RecordId(self.connector, self.account, issuer)
        secret: dict[str, Any] = grant.model_dump(mode="json", exclude_none=True)
        put = functools.partial(self._store.put, record, secret, generation=self._generation)
        try:
            await anyio.to_thread.run_sync(put)
        except StaleGrant:
            logger.warning("the grant of %s was revoked meanwhile; what this write held is discarded", self.connector)
            if grant.tokens is not None and self._discarded is not None:
                self._discarded(grant)
            raise
        except (OSError, StorageError):
            logger.error("could not save the OAuth record of %s (%s at %s)", self.connector, self.account, issuer)
            raise
        if self._grants is not None:
            self._grants[issuer] = grant
        self._current = issuer
        logger.debug("saved the OAuth record of %s (%s at %s)", self.connector, self.account, issuer)

    # -- what the provider knows -------------------------------------------------------------------

    def _metadata(self) -> dict[str, Any]:
        found = discovered(self._context) if self._context is not None else Discovered()
        return {"authorization_server": found.authorization_server, "protected_resource": found.protected_resource}

    def _discovered_issuer(self) -> str | None:
        found = discovered(self._context) if self._context is not None else Discovered()
        return str(found.authorization_server.issuer) if found.authorization_server is not None else None

    def _origin(self) -> str:
        """The resource server's origin: the issuer of the 2025-03-26 fallback (RFC 8414 §3.3)."""
        if self._context is None:
            return ""
        parts = urlsplit(self._context.server_url)
        return f"{parts.scheme}://{parts.netloc}"
