"""The internal API, ``/mcp/internal/<id>/api/<path>``: how a connector process reaches its upstream (contract §7).

The only way a local OAuth connector reaches its provider's API, without ever holding the user's token.
Each request, in this order (each refusal audited, nothing sent upstream):

1. the raw request target must be ``/mcp/internal/<id>/api`` plus a path; aiohttp's own decoding and
   dot-segment folding are never trusted for what is forwarded — the raw bytes are checked;
2. ``Authorization: Bearer <credential>``: the process's own (``auth.process_credentials``), minted for
   this connector — 401 otherwise, including one of another connector or one revoked;
3. ``X-Sidecar-Context``: a valid envelope (403 otherwise) of the credential's own session (401 otherwise);
4. the connector is still trusted as configured and has an ``oauth-client.json`` (401 otherwise);
5. method and path against its declared upstream (``oauth.target``): 403;
6. forwarded with the real access token (``oauth.forward``): refresh first when due, one retry after a
   401, redirects only within the upstream, the answer bounded and stripped of credentials.

Revoking the credential (process exit, session end, untrust, ``connectors revoke``) aborts the upstream
request in flight: the connector gets 401 ``unauthorized``. A grant that cannot be used (never signed in,
revoked, refresh refused) is 401 ``unauthorized`` with the ``connect`` hint, in plain words.

Audit: ``internal.request`` with connector, session, method, the matched path template (the declared
prefix and ``*``, never the caller's path), status and response bytes; never headers or bodies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from aiohttp import web

from sidecar.auth.middleware import bearer_token, session_envelope
from sidecar.auth.process_credentials import ProcessCredential, ProcessCredentials
from sidecar.auth.sessions import SessionStore
from sidecar.config import Limits
from sidecar.errors import NotFound, SidecarError, Unauthorized
from sidecar.net.body import read_body
from sidecar.oauth.forward import Forwarder, UpstreamResponse
from sidecar.oauth.grant import GrantKeeper, NeedsAuthorization
from sidecar.oauth.target import Target, UpstreamRule
from sidecar.store.tally import AuditTally

__all__ = ["INTERNAL_ROUTE", "InternalApi"]

logger = logging.getLogger(__name__)

INTERNAL_ROUTE: Final = "/mcp/internal/{connector_id}/api{tail:.*}"
_PREFIX: Final = "/mcp/internal/"

Audit = Callable[..., object]


class InternalApi:
    """The handler of ``INTERNAL_ROUTE``; every dependency passed in (``app._edge`` builds it)."""

    def __init__(
        self,
        *,
        credentials: ProcessCredentials,
        sessions: SessionStore,
        upstream_of: Callable[[str], UpstreamRule | None],
        keeper: Callable[[str], GrantKeeper],
        forwarder: Forwarder,
        audit: Audit,
        refusals: AuditTally,
        limits: Limits,
    ) -> None:
        """``upstream_of(id)``: the connector's upstream rule while it is trusted and has one, else None."""
        self._credentials = credentials
        self._sessions = sessions
        self._upstream_of = upstream_of
        self._keeper = keeper
        self._forwarder = forwarder
        self._audit = audit
        self._refusals = refusals
        self._limits = limits

    async def handle(self, request: web.Request) -> web.Response:
        connector_id = request.match_info["connector_id"]
        record: dict[str, object] = {"connector": connector_id, "method": request.method, "path": None}
        try:
            answer = await self._handle(request, connector_id, record)
        except SidecarError as exc:
            if "session" not in record:
                # SECURITY: refused before any credential was known: counted, never a record per request
                # (anyone on loopback could fill the disk), and the id from the URL is not written at all.
                self._refusals.count("internal", exc.code)
            else:
                self._audit("internal.request", **record, status=exc.status, bytes=0, refused=exc.code)
            raise
        self._audit("internal.request", **record, status=answer.status, bytes=len(answer.body))
        return web.Response(status=answer.status, headers=answer.headers, body=answer.body)

    async def _handle(self, request: web.Request, connector_id: str, record: dict[str, object]) -> UpstreamResponse:
        raw_path, _, raw_query = request.raw_path.partition("?")
        prefix = f"{_PREFIX}{connector_id}/api"
        tail = raw_path[len(prefix) :]
        if not raw_path.startswith(prefix) or (tail and not tail.startswith("/")):
            raise NotFound("no such internal API path")
        credential = self._credentials.check(bearer_token(request), connector_id)
        record["session"] = credential.session_id
        session = self._sessions.verify(session_envelope(request))
        if session.id != credential.session_id:
            # SECURITY: a credential leaked to another session's process is useless there.
            raise Unauthorized("this credential belongs to another session")
        rule = self._upstream_of(connector_id)
        if rule is None:
            self._credentials.revoke(credential)
            raise Unauthorized(f"connector {connector_id} is no longer trusted, or declares no upstream")
        target = rule.resolve(request.method, tail or "/", raw_query)
        record["path"] = target.template
        body = await read_body(request, self._limits, json_body=False)  # the same bounds as every body
        return await self._forward(credential, rule, request, target, body)

    async def _forward(
        self, credential: ProcessCredential, rule: UpstreamRule, request: web.Request, target: Target, body: bytes
    ) -> UpstreamResponse:
        keeper = self._keeper(credential.connector_id)
        call = asyncio.ensure_future(
            self._forwarder.forward(keeper, rule, target, method=request.method, headers=request.headers, body=body)
        )

        def abort() -> None:
            call.cancel()

        with self._credentials.call(credential, abort):
            try:
                return await call
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if call.cancelled() and (current is None or not current.cancelling()):
                    raise Unauthorized("the credential was revoked during the call") from None
                raise
            except NeedsAuthorization as exc:
                raise Unauthorized(f"unauthorized: {exc}") from None
