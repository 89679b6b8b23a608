"""One connector's grant in the daemon: its sign-in state, its access token, and refresh that never races.

The daemon holds one ``GrantKeeper`` per remote connector, shared by every session, so a rotating
refresh token is spent once however many sessions call at the same moment (the peers' worst bug:
anthropics/claude-code#91641, anomalyco/opencode#34074, punkpeye/mcp-remote PR #351):

- **ahead of expiry**: a token is refreshed a minute before it expires, or a tenth of its lifetime
  before when that is shorter; until then it is used as is;
- **once per grant at a time**: one ``asyncio.Lock``; whoever waited on it finds the new token and
  refreshes nothing;
- **outcomes**: ``invalid_grant`` (and the other RFC 6749 §5.2 refusals) means the grant is gone: the
  tokens are deleted and the state is ``unauthorized``. A network error, 429 or 5xx is the server's
  trouble, not the grant's: the tokens are kept and the next attempt waits out an exponential backoff
  (the token is used meanwhile while it has not expired);
- **a cap**: at most ``TOKEN_REQUESTS`` token requests per ``TOKEN_WINDOW`` per grant (mcp-remote's
  "token storm" cap), whatever goes wrong around it;
- **a revoke wins** (issue 24): the broker ``forget``s the grant before the store deletes it, so no
  refresh starts after, and again once it is deleted; a ``load`` that read before the delete finds its
  generation stale and keeps nothing; a refresh already in flight writes for the generation it started
  from and is refused (its tokens go to the broker to be revoked), or wrote just before the delete (the
  revoke deleted and revokes that record): either way it ends with ``NeedsAuthorization``, never with
  the grant back in memory. The token request runs in a task of its own, so a caller cancelled
  meanwhile (a revoke stops the connector's calls) does not lose tokens the AS already issued; the
  next caller joins it, and ``settled`` lets the revoke wait for it.

The SDK's provider is not used here: it holds one lock across every request it authorizes (all
sessions' calls would queue behind each other), clears its tokens on any refresh failure, and
authorizes interactively inside a tool call. It signs in (``broker``); this keeps the grant.
Nothing here logs or audits a token; messages name the connector and the AS's error code only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import enum
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, Final
from urllib.parse import quote, urlsplit

import httpx2
from mcp.shared.auth import OAuthToken
from pydantic import ValidationError

from sidecar.errors import StaleGrant, ToolError
from sidecar.oauth.capped import TokenCap, token_endpoint_failure
from sidecar.oauth.stepup import StepUp, answer_with_error, scope_challenge
from sidecar.oauth.storage import CredentialTokenStorage, StoredGrant

__all__ = ["BrokerAuth", "GrantKeeper", "NeedsAuthorization", "SignIn", "refresh_margin"]

logger = logging.getLogger(__name__)

REFRESH_MARGIN: Final = 60.0
"""Seconds before expiry a token is refreshed (or a tenth of its lifetime, when shorter)."""
TOKEN_REQUESTS: Final = 20
TOKEN_WINDOW: Final = 30.0
"""At most ``TOKEN_REQUESTS`` token requests per grant in any ``TOKEN_WINDOW`` seconds."""
BACKOFF_START: Final = 1.0
BACKOFF_MAX: Final = 60.0
"""Seconds to wait after a failed refresh (network, 429, 5xx), doubling per failure up to the max."""
TOKEN_TIMEOUT: Final = 20.0
"""Seconds for one request to the token endpoint."""
_GONE: Final = frozenset({"invalid_grant", "invalid_client", "unauthorized_client", "invalid_scope"})
"""RFC 6749 §5.2 errors after which the grant is unusable: sign in again."""


class SignIn(enum.StrEnum):
    """A connector's sign-in state, beside its lifecycle state (contract §7)."""

    NONE = "none"
    """No sign-in needed so far (the server never asked), or none started."""
    STARTING = "starting"
    READY = "ready"
    NEEDED = "unauthorized"
    """A sign-in is needed (never signed in, or the grant ended); the contract's word is ``unauthorized``,
    which in code means a 401 (``errors.Unauthorized``) only."""
    ERROR = "error"


class NeedsAuthorization(ToolError):
    """The connector needs a sign-in, which runs out of band (``sidecar connectors connect``), never in a call."""

    code = "needs_authorization"

    def __init__(self, connector_id: str) -> None:
        super().__init__(f"connector {connector_id} needs a sign-in: run sidecar connectors connect {connector_id}")


def refresh_margin(lifetime: float | None) -> float:
    """How long before expiry to refresh a token that lived ``lifetime`` seconds."""
    if lifetime is None or lifetime <= 0:
        return REFRESH_MARGIN
    return min(REFRESH_MARGIN, lifetime / 10)


Audit = Callable[..., object]


class GrantKeeper:
    """The grant of one connector: loaded from the store once, refreshed in place, dropped when dead."""

    def __init__(
        self,
        connector_id: str,
        storage: CredentialTokenStorage,
        *,
        audit: Audit,
        clock: Callable[[], float] = time.time,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.connector_id = connector_id
        self.state = SignIn.NONE
        self.reason: str | None = None
        self._storage = storage
        self._audit = audit
        self._clock = clock
        self._transport = transport
        self._grant: StoredGrant | None = None
        self._loaded = False
        self._lock = asyncio.Lock()
        self._exchanging: asyncio.Task[StoredGrant] | None = None
        """The token request in flight, in a task of its own (a cancelled caller does not end it)."""
        self._requests: collections.deque[float] = collections.deque()
        self._failures = 0
        self._retry_at = 0.0
        self.refreshes = 0
        """Token requests that succeeded (tests count them)."""
        self.step_up = StepUp(connector_id)

    # -- state ---------------------------------------------------------------------------------

    def public(self) -> dict[str, Any]:
        """The sign-in state and, with a grant, its scopes: all granted, and those beyond what was asked."""
        reason = self.reason if self.state is not SignIn.READY else self.step_up.reason()
        shown: dict[str, Any] = {"auth": self.state.value, "auth_reason": reason}
        grant = self._grant
        if grant is not None and grant.tokens is not None:
            shown["granted_scopes"] = grant.granted_scopes()
            shown["granted_beyond_asked"] = grant.beyond_asked()
        return shown

    def granted_scope(self) -> str | None:
        """The scope the current tokens were granted (as the AS said, or as asked when it said nothing)."""
        grant = self._grant
        return grant.tokens.scope if grant is not None and grant.tokens is not None else None

    def set_state(self, state: SignIn, reason: str | None = None) -> None:
        self.state, self.reason = state, reason

    def blocked(self) -> bool:
        """True when a call would fail for want of a sign-in (known without any I/O)."""
        has_tokens = self._grant is not None and self._grant.tokens is not None
        return self._loaded and not has_tokens and self.state in (SignIn.NEEDED, SignIn.ERROR, SignIn.STARTING)

    async def load(self) -> StoredGrant | None:
        """(Re-)read the grant from the store. Tokens that can still be used (a refresh token, or an access
        token not yet expired) make the state ``ready``; an expired one that cannot be refreshed makes
        it ``unauthorized`` (the next call drops it)."""
        async with self._lock:
            await self._exchange_ended()
            grant = await self._storage.current()
            if self._storage.stale():  # revoked while it was read: what it read is deleted (and revoked)
                grant = None
            self._grant = grant
            self._loaded = True
            if grant is not None and grant.tokens is not None:
                if grant.tokens.refresh_token is not None or not self._expired(grant):
                    self.set_state(SignIn.READY)
                    self.step_up.signed_in(grant.tokens.scope)
                    self._failures, self._retry_at = 0, 0.0
                else:
                    self.set_state(SignIn.NEEDED, "the token expired and the server gave no refresh token")
            return grant

    async def storage_grant(self) -> StoredGrant | None:
        """The grant as stored now, without changing the state (nor what a refresh in flight builds on)."""
        return await self._storage.peek()

    async def settled(self) -> None:
        """Return once no refresh (nor load) of this grant is in flight: one that began has ended."""
        async with self._lock:
            await self._exchange_ended()

    def forget(self, reason: str) -> StoredGrant | None:
        """The local grant is gone (revoked, deleted): calls need a sign-in. Returns what was held."""
        grant, self._grant = self._grant, None
        self._loaded = True
        self.set_state(SignIn.NEEDED, reason)
        return grant

    # -- the token -----------------------------------------------------------------------------

    async def access_token(self) -> str | None:
        """The access token to send now, refreshed first when due; None when none is needed (yet)."""
        if not self._loaded:
            await self.load()
        grant = self._grant
        if grant is None or grant.tokens is None:
            if self.state in (SignIn.NONE,):
                return None  # not known to need OAuth: the request goes out bare; a 401 says otherwise
            raise NeedsAuthorization(self.connector_id)
        if self._due(grant):
            grant = await self._refresh(grant.tokens.access_token, forced=False)
        return grant.tokens.access_token if grant.tokens is not None else None

    async def rejected(self, token: str | None) -> str:
        """The server answered 401 to ``token``: the token another caller refreshed meanwhile, or one
        forced refresh; otherwise the connector needs a sign-in (``NeedsAuthorization``)."""
        if token is None:
            self.set_state(SignIn.NEEDED, "the server asks for a sign-in")
            raise NeedsAuthorization(self.connector_id)
        grant = await self._refresh(token, forced=True)
        if grant.tokens is None or grant.tokens.access_token == token:
            raise NeedsAuthorization(self.connector_id)
        return grant.tokens.access_token

    def _due(self, grant: StoredGrant) -> bool:
        if grant.expires_at is None:
            return False
        lifetime = grant.expires_at - grant.issued_at if grant.issued_at is not None else None
        return self._clock() >= grant.expires_at - refresh_margin(lifetime)

    def _expired(self, grant: StoredGrant) -> bool:
        return grant.expires_at is not None and self._clock() >= grant.expires_at

    async def _refresh(self, seen: str, *, forced: bool) -> StoredGrant:
        """Refresh the grant whose access token was ``seen``, unless another caller already did."""
        async with self._lock:
            task = self._exchanging
            if task is None:
                decided = await self._decide(seen, forced=forced)
                if isinstance(decided, StoredGrant):
                    return decided
                task = self._exchanging = asyncio.ensure_future(decided)
                task.add_done_callback(self._exchanged)
            # else the request of a caller cancelled meanwhile is still out: its outcome is ours (single flight)
            return await asyncio.shield(task)

    async def _decide(self, seen: str, *, forced: bool) -> StoredGrant | Coroutine[Any, Any, StoredGrant]:
        """Under the lock: the grant to use as it is, or the token request to make (``_exchange``)."""
        grant = self._grant
        if grant is None or grant.tokens is None:
            raise NeedsAuthorization(self.connector_id)
        if grant.tokens.access_token != seen or not (forced or self._due(grant)):
            return grant  # refreshed while we waited: single flight
        if grant.tokens.refresh_token is None:
            if forced or self._expired(grant):
                await self._drop("the token expired and the server gave no refresh token")
                raise NeedsAuthorization(self.connector_id)
            return grant
        wait = self._retry_at - self._clock()
        if wait > 0:
            return self._keep_or_fail(grant, f"a refresh failed; sidecar retries in {wait:.0f}s", forced=forced)
        if not self._admit_request():
            return self._keep_or_fail(grant, "too many token requests; try again shortly", forced=forced)
        return self._exchange(grant, forced=forced)

    def _exchanged(self, task: asyncio.Task[StoredGrant]) -> None:
        if self._exchanging is task:
            self._exchanging = None
        if not task.cancelled():
            task.exception()  # retrieved: its callers may all be gone; what it did is in the state

    async def _exchange_ended(self) -> None:
        """Wait (the lock held) for a token request that a cancelled caller left running."""
        task = self._exchanging
        if task is not None:
            await asyncio.wait({task})

    def _keep_or_fail(self, grant: StoredGrant, why: str, *, forced: bool) -> StoredGrant:
        if forced or self._expired(grant):
            raise ToolError(f"connector {self.connector_id} could not refresh its sign-in: {why}")
        return grant  # still valid for a while: use it

    def _admit_request(self) -> bool:
        now = self._clock()
        while self._requests and now - self._requests[0] > TOKEN_WINDOW:
            self._requests.popleft()
        if len(self._requests) >= TOKEN_REQUESTS:
            return False
        self._requests.append(now)
        return True

    async def _exchange(self, grant: StoredGrant, *, forced: bool) -> StoredGrant:
        url, data, headers = refresh_request(grant, self._storage_server_url(grant), self.connector_id)
        try:
            async with httpx2.AsyncClient(timeout=TOKEN_TIMEOUT, transport=TokenCap(self._transport)) as http:
                response = await http.post(url, data=data, headers=headers)
            body = response.content
        except httpx2.HTTPError as exc:
            return await self._backoff(grant, token_endpoint_failure(exc), forced)
        if response.status_code == 200:
            try:
                tokens = OAuthToken.model_validate_json(body)
            except ValidationError:
                return await self._backoff(grant, "the token endpoint answered 200 without tokens", forced)
            old = grant.tokens
            if old is not None:
                # RFC 6749 §6: no new refresh token means the old one stays valid; no scope means unchanged.
                tokens = tokens.model_copy(
                    update={
                        "refresh_token": tokens.refresh_token or old.refresh_token,
                        "scope": tokens.scope or old.scope,
                    }
                )
            try:
                stored = await self._storage.replace_tokens(tokens)
            except StaleGrant:
                stored = None  # revoked while the request was out: refused, the tokens go to be revoked
            if stored is None or self._storage.stale():  # stale: written just before the revoke deleted it
                self._grant = None
                logger.info("the refresh of %s ended after a revoke; its tokens are not kept", self.connector_id)
                raise NeedsAuthorization(self.connector_id)
            self._grant = stored
            self._failures, self._retry_at = 0, 0.0
            self.refreshes += 1
            self.set_state(SignIn.READY)
            logger.info("refreshed the sign-in of %s", self.connector_id)
            return self._grant
        error = _oauth_error(body)
        if response.status_code in (400, 401) and (error in _GONE or error is None):
            await self._drop(f"the authorization server refused the refresh ({error or response.status_code})")
            self._audit("oauth.refresh_failed", connector=self.connector_id, error=error or str(response.status_code))
            raise NeedsAuthorization(self.connector_id)
        return await self._backoff(grant, f"the token endpoint answered {response.status_code}", forced)

    async def _backoff(self, grant: StoredGrant, why: str, forced: bool) -> StoredGrant:
        self._failures += 1
        delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** (self._failures - 1))
        self._retry_at = self._clock() + delay
        logger.warning("refresh of %s failed: %s; next try in %gs", self.connector_id, why, delay)
        self._audit("oauth.refresh_failed", connector=self.connector_id, error=why, retry_in=delay)
        return self._keep_or_fail(grant, why, forced=forced)

    async def _drop(self, reason: str) -> None:
        """The grant is dead: delete its tokens (keeping the client registration), need a sign-in."""
        logger.warning("sign-in of %s is no longer valid: %s", self.connector_id, reason)
        self._grant = None
        self.set_state(SignIn.NEEDED, reason)
        await self._storage.clear_tokens()

    @staticmethod
    def _storage_server_url(grant: StoredGrant) -> str | None:
        return str(grant.protected_resource.resource) if grant.protected_resource is not None else None


def refresh_request(
    grant: StoredGrant, resource: str | None, connector_id: str
) -> tuple[str, dict[str, str], dict[str, str]]:
    """(token endpoint, form, headers) of an RFC 6749 §6 refresh, with RFC 8707 ``resource`` and client auth."""
    if grant.tokens is None or grant.tokens.refresh_token is None or grant.client is None:
        raise NeedsAuthorization(connector_id)
    if grant.authorization_server is not None:
        url = str(grant.authorization_server.token_endpoint)
    elif resource is not None:  # the 2025-03-26 fallback: the server is its own AS
        parts = urlsplit(resource)
        url = f"{parts.scheme}://{parts.netloc}/token"
    else:
        raise NeedsAuthorization(connector_id)
    data = {"grant_type": "refresh_token", "refresh_token": grant.tokens.refresh_token}
    if resource is not None:
        data["resource"] = resource
    return (url, *client_auth(grant, data))


def client_auth(grant: StoredGrant, data: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """RFC 6749 §2.3.1 client authentication for a token or revocation request (RFC 7009 §2.1)."""
    client = grant.client
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    if client is None:
        return data, headers
    data = {**data, "client_id": client.client_id}
    method = client.token_endpoint_auth_method
    if method == "client_secret_basic" and client.client_secret:
        pair = f"{quote(client.client_id, safe='')}:{quote(client.client_secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        del data["client_id"]
    elif method == "client_secret_post" and client.client_secret:
        data["client_secret"] = client.client_secret
    return data, headers


def _oauth_error(body: bytes) -> str | None:
    """The RFC 6749 §5.2 ``error`` code of a token endpoint answer (a short ASCII word), if any."""
    try:
        value = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return value[:64] if isinstance(value, str) and value.isascii() else None


class BrokerAuth(httpx2.Auth):
    """The ``httpx2.Auth`` of a remote connector's transport: the keeper's bearer token on every request.

    A 401 gets one retry with the token another caller refreshed meanwhile, or after one forced
    refresh; otherwise the call fails fast with ``NeedsAuthorization``: sign-in runs out of band. A
    ``403 insufficient_scope`` becomes that call's JSON-RPC error naming the scope and the sign-in to
    run (``stepup``); the connection and the grant stay.
    """

    def __init__(self, keeper: GrantKeeper) -> None:
        self._keeper = keeper

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        token = await self._keeper.access_token()
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        challenged = scope_challenge(response)
        if challenged is not None:
            await answer_with_error(response, self._keeper.step_up.refused(challenged, self._keeper.granted_scope()))
            return
        if response.status_code != 401 or not _bearer_challenge(response):
            return
        retry = await self._keeper.rejected(token)
        request.headers["Authorization"] = f"Bearer {retry}"
        yield request


def _bearer_challenge(response: httpx2.Response) -> bool:
    return any(value.lower().startswith("bearer") for value in response.headers.get_list("www-authenticate"))
