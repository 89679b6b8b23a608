"""Revoking a grant's tokens at its authorization server (RFC 7009), now or in the background.

The broker's ``revoke`` deletes a grant and then hands this module every token it must end at the AS:
those of the records it deleted, and those a refresh or sign-in in flight obtained but could not store
(the store refused the write as stale, issue 24: ``CredentialTokenStorage`` hands such a grant to
``discarded``). While a revoke waits for that work to end, ``collect`` gathers what is handed back so
it is revoked with the rest and counted in the revoke's answer; handed back at any other time, it is
revoked at once in the background. Nothing that was obtained for a revoked grant is left active
without a retry saying so.

One attempt revokes the refresh token, then the access token (RFC 7009 §2.1), then any access token an
earlier refresh replaced before it expired (kept in the grant for this: an AS may end only the token
named, so every token the daemon obtained for the grant is revoked, not only the last). A 5xx or 429 (§2.2.1),
or an unreachable AS, is tried again in the background ``REVOKE_TRIES`` times in all, the wait
doubling from ``REVOKE_BACKOFF``; the audit log says when it succeeded or gave up. Nothing here logs or
audits a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import httpx2

from sidecar.oauth.grant import client_auth
from sidecar.oauth.storage import StoredGrant

__all__ = ["HTTP_TIMEOUT", "REVOKE_BACKOFF", "REVOKE_TRIES", "Revoker", "revocation_endpoint"]

logger = logging.getLogger(__name__)

HTTP_TIMEOUT: Final = 30.0
REVOKE_TRIES: Final = 5
REVOKE_BACKOFF: Final = 2.0
"""Seconds before the second remote revocation attempt, doubling after each failure."""

REVOKED: Final = "revoked"
RETRYING: Final = "retrying"
UNSUPPORTED: Final = "not supported by the authorization server"
NOTHING: Final = "nothing to revoke"

Audit = Callable[..., object]


class Revoker:
    """Every remote revocation of one daemon, and the tokens handed back by refused writes."""

    def __init__(self, *, audit: Audit) -> None:
        self._audit = audit
        self._collecting: dict[str, list[StoredGrant]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def collect(self, connector_id: str) -> list[StoredGrant]:
        """Gather what is handed back for the connector (``discarded``) until ``finish``; a second revoke
        of the same connector meanwhile shares the list (revoking a token twice is harmless)."""
        return self._collecting.setdefault(connector_id, [])

    def discarded(self, connector_id: str, grant: StoredGrant) -> None:
        """A write for a revoked grant was refused: its tokens must end at the AS too."""
        collecting = self._collecting.get(connector_id)
        if collecting is not None:
            collecting.append(grant)
            return
        self.spawn(self._revoke_late(connector_id, grant))

    async def finish(self, connector_id: str, grants: list[StoredGrant]) -> str:
        """Stop collecting, and revoke every token of ``grants`` (one attempt each now, the failed ones
        again in the background). Returns what the revoke answers: ``revoked`` when the AS took all,
        ``retrying`` when some go on in the background, else why nothing was sent."""
        if self._collecting.get(connector_id) is grants:
            del self._collecting[connector_id]
        outcomes = set()
        for grant in _distinct(grants):
            endpoint = revocation_endpoint(grant)
            if endpoint is None:
                outcomes.add(UNSUPPORTED)
            elif await self._revoke_remote(connector_id, endpoint, grant):
                outcomes.add(REVOKED)
            else:
                outcomes.add(RETRYING)
                self.spawn(self._revoke_later(connector_id, endpoint, grant))
        for outcome in (RETRYING, UNSUPPORTED, REVOKED):
            if outcome in outcomes:
                return outcome
        return NOTHING

    async def finish_later(self, connector_id: str, in_flight: Awaitable[object], grants: list[StoredGrant]) -> None:
        """``finish`` once the work a revoke stopped waiting for has ended (bounded by the caller)."""
        with contextlib.suppress(Exception):
            await in_flight
        remote = await self.finish(connector_id, grants)
        if remote != RETRYING:  # a retry audits its own outcome
            self._audit("oauth.revoke", connector=connector_id, remote=remote)

    async def _revoke_late(self, connector_id: str, grant: StoredGrant) -> None:
        endpoint = revocation_endpoint(grant)
        if endpoint is None:
            logger.warning("tokens of %s obtained after its revoke cannot be revoked: no endpoint", connector_id)
            self._audit("oauth.revoke", connector=connector_id, remote=UNSUPPORTED)
        elif await self._revoke_remote(connector_id, endpoint, grant):
            self._audit("oauth.revoke", connector=connector_id, remote=REVOKED)
        else:
            await self._revoke_later(connector_id, endpoint, grant)

    async def _revoke_remote(self, connector_id: str, endpoint: str, grant: StoredGrant) -> bool:
        """One attempt: refresh token, then access token (RFC 7009 §2.1), then the access tokens earlier
        refreshes replaced that have not expired; True when the AS took them all."""
        tokens = grant.tokens
        if tokens is None:
            return True
        pending = [(tokens.refresh_token, "refresh_token"), (tokens.access_token, "access_token")]
        pending += [(old.access_token, "access_token") for old in grant.superseded]
        try:
            async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as http:
                for value, hint in pending:
                    if value is None:
                        continue
                    data, headers = client_auth(grant, {"token": value, "token_type_hint": hint})
                    response = await http.post(endpoint, data=data, headers=headers)
                    if response.status_code >= 500 or response.status_code == 429:
                        return False  # RFC 7009 §2.2.1: 503 means try again later
                    if response.status_code != 200:
                        logger.warning("revocation at the AS of %s answered %d", connector_id, response.status_code)
        except httpx2.HTTPError as exc:
            logger.warning("revocation for %s failed: %s", connector_id, type(exc).__name__)
            return False
        return True

    async def _revoke_later(self, connector_id: str, endpoint: str, grant: StoredGrant) -> None:
        delay = REVOKE_BACKOFF
        for _ in range(REVOKE_TRIES - 1):
            await asyncio.sleep(delay)
            if await self._revoke_remote(connector_id, endpoint, grant):
                self._audit("oauth.revoke", connector=connector_id, remote=REVOKED)
                return
            delay *= 2
        self._audit("oauth.revoke", connector=connector_id, remote="gave up")
        logger.warning("gave up revoking the tokens of %s at its authorization server", connector_id)

    def spawn(self, coroutine: Awaitable[Any]) -> None:
        """Run ``coroutine`` in the background until it ends or ``close``."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel the background revocations (bounded: they only wait on the network or a backoff)."""
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)


def revocation_endpoint(grant: StoredGrant | None) -> str | None:
    if grant is None or grant.authorization_server is None:
        return None
    endpoint = grant.authorization_server.revocation_endpoint
    return str(endpoint) if endpoint is not None else None


def _distinct(grants: Iterable[StoredGrant]) -> list[StoredGrant]:
    """The grants holding tokens, each set of tokens once."""
    seen: set[tuple[str, str | None]] = set()
    found = []
    for grant in grants:
        if grant.tokens is None:
            continue
        key = (grant.tokens.access_token, grant.tokens.refresh_token)
        if key not in seen:
            seen.add(key)
            found.append(grant)
    return found
