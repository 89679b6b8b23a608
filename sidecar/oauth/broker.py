"""The daemon's OAuth broker: one per daemon, one grant per remote connector, sign-in out of band.

- **Calls** reach a remote connector through ``auth_for(id)`` (a ``BrokerAuth`` over the connector's
  ``GrantKeeper``, shared by every session); a connector without a grant fails fast with
  ``NeedsAuthorization`` and the ``connect`` hint, never authorizing inside a tool call.
- **Sign-in** (``connect``) runs the SDK's provider (``flow.build_provider``: discovery, registration,
  PKCE S256 and the S256 rule, ``resource``, the ``iss`` check) in a task of its own, driven by
  ``_CallbackDriver``: the authorization URL goes back to whoever asked (the CLI opens a browser),
  and the code comes in on the daemon's own ``/oauth/callback``, matched by ``state`` (single use) and
  accepted only from the browser that opened the flow's start link (``binding``: ``browser_url``).
  One pending flow per connector (a second ``connect`` joins it); a flow ends after ``FLOW_TIMEOUT``.
- **Revocation** wins over whatever is in flight (issue 24). It forgets the grant in memory (no refresh
  starts after), bumps the grant's generation and deletes every record in one step
  (``CredentialStore.revoke_connector``), and announces it (``revoked``: the daemon stops the
  connector's connections in every session). A pending sign-in is told it was revoked (its link stops
  working). Then it waits, at most ``SETTLE_TIMEOUT``, for a refresh or sign-in already in flight to
  end: each writes for the generation it began with, so its result is refused and its tokens are
  handed back here (``_discarded``), never stored. Last it revokes remotely (RFC 7009: the refresh
  token, then the access token) every token it deleted or was handed, where the AS metadata names a
  ``revocation_endpoint``, retrying in the background a bounded number of times (``retrying``; also
  when something was still in flight at the bound: what it obtains is revoked when it ends).
- **Events**: the broker knows nothing of connectors; whoever must act on a sign-in subscribes
  (``subscribe``) and is told ``signed_in`` (a sign-in completed, before its flow is done) and
  ``revoked`` (the grant was deleted, before the remote revocation).

Audit records (``oauth.connect``, ``oauth.refresh_failed``, ``oauth.revoke``) name the connector and
the outcome, never a token, a code or a state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple
from urllib.parse import parse_qs, urlsplit

import anyio.to_thread
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult

from sidecar.errors import Conflict, StaleGrant, StorageError, find_error
from sidecar.oauth.binding import BrowserBinding, FlowCookie
from sidecar.oauth.capped import TokenCap
from sidecar.oauth.declared import PreRegistered
from sidecar.oauth.flow import AuthorizationRefused, build_provider, s256_guard
from sidecar.oauth.grant import BrokerAuth, GrantKeeper, NeedsAuthorization, SignIn
from sidecar.oauth.provider import ProviderClient, sign_in
from sidecar.oauth.revocation import Revoker
from sidecar.oauth.storage import CredentialTokenStorage, StoredGrant, grants_in
from sidecar.store.credentials import CredentialStore
from sidecar.text import preview

__all__ = ["ACCOUNT", "CALLBACK_PATH", "FLOW_TIMEOUT", "Broker", "Callback", "PreRegistered"]

logger = logging.getLogger(__name__)

CALLBACK_PATH: Final = "/oauth/callback"
ACCOUNT: Final = "default"
FLOW_TIMEOUT: Final = 600.0
"""Seconds a sign-in may take, browser included, before its flow ends."""
URL_TIMEOUT: Final = 60.0
"""Seconds ``connect`` waits for discovery and registration to produce the authorization URL."""
CALLBACK_WAIT: Final = 20.0
"""Seconds the callback page waits for the token exchange, to say whether the sign-in worked."""
HTTP_TIMEOUT: Final = 30.0
SETTLE_TIMEOUT: Final = 10.0
"""Seconds a revoke waits for a refresh or sign-in in flight to end, to revoke what it obtained with the
rest; past it the revoke answers ``retrying`` and revokes those tokens in the background when they come."""
LATE_TIMEOUT: Final = FLOW_TIMEOUT
"""Seconds the background goes on waiting for work a revoke did not see end (a sign-in's own bound)."""


@dataclass(slots=True)
class _Flow:
    id: str
    connector_id: str
    url: asyncio.Future[str | None]
    result: asyncio.Future[AuthorizationCodeResult]
    generation: int = 0
    """The grant generation the sign-in started from: what it stores is refused once the grant is revoked."""
    task: asyncio.Task[None] | None = None
    state_key: bytes | None = None
    outcome: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    binding: BrowserBinding = field(init=False)

    def __post_init__(self) -> None:
        self.binding = BrowserBinding(self.id)


class Callback(NamedTuple):
    """What ``/oauth/callback`` tells the browser; ``refused`` names why when no flow took the request
    (counted in aggregate, never audited one by one)."""

    ok: bool
    message: str
    refused: str | None = None


Audit = Callable[..., object]
SignInListener = Callable[[str, str], Awaitable[None]]
"""Called with (connector id, event): ``signed_in`` or ``revoked`` (module docstring), in subscription order."""


class Broker:
    """Every remote connector's grant and sign-in; one per daemon (the app's ``oauth`` subsystem)."""

    def __init__(
        self,
        store: CredentialStore,
        *,
        redirect_uri: Callable[[], str],
        audit: Audit,
    ) -> None:
        self.store = store
        self._redirect_uri = redirect_uri
        self._audit = audit
        self._listeners: list[SignInListener] = []
        self._keepers: dict[str, GrantKeeper] = {}
        self._flows: dict[str, _Flow] = {}
        self._by_state: dict[bytes, _Flow] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._revoker = Revoker(audit=audit)

    def subscribe(self, listener: SignInListener) -> None:
        """Be told of every completed sign-in and every revocation (``SignInListener``)."""
        self._listeners.append(listener)

    # -- for the connectors ----------------------------------------------------------------------

    def keeper(self, connector_id: str) -> GrantKeeper:
        keeper = self._keepers.get(connector_id)
        if keeper is None:
            storage = self._storage(connector_id)
            keeper = self._keepers[connector_id] = GrantKeeper(connector_id, storage, audit=self._audit)
        return keeper

    def _storage(self, connector_id: str, *, generation: int | None = None, **options: Any) -> CredentialTokenStorage:
        """An adapter over the store for one of our writers (the keeper, a sign-in): its refused writes'
        tokens come back to ``_discarded``."""
        return CredentialTokenStorage(
            self.store,
            connector=connector_id,
            account=ACCOUNT,
            generation=generation,
            discarded=functools.partial(self._discarded, connector_id),
            **options,
        )

    def auth_for(self, connector_id: str) -> httpx2.Auth:
        return BrokerAuth(self.keeper(connector_id))

    def require(self, connector_id: str) -> None:
        """Fail fast (``NeedsAuthorization``) when the connector is known to need a sign-in it lacks."""
        keeper = self._keepers.get(connector_id)
        if keeper is not None and keeper.blocked():
            raise NeedsAuthorization(connector_id)

    def public(self, connector_id: str, *, declared: bool = False) -> dict[str, Any]:
        """``auth`` (the sign-in state) and ``auth_reason`` for the control API. ``declared``: the
        connector's config names an OAuth client, so with no sign-in yet it is ``unauthorized`` (as at
        start, ``load``), also when it was added while the daemon runs."""
        keeper = self._keepers.get(connector_id)
        if keeper is None or keeper.state is SignIn.NONE:
            if declared:
                return {"auth": SignIn.NEEDED.value, "auth_reason": "not signed in yet"}
            return {"auth": SignIn.NONE.value, "auth_reason": None}
        return keeper.public()

    async def load(self, connectors: Mapping[str, bool]) -> None:
        """At start: each remote connector's sign-in state from what the store holds, not ``none`` until
        its first call. ``connectors``: id → whether its config names an OAuth client. One without usable
        tokens is ``unauthorized`` when it declares a client or a client was registered for it before
        (its server asked for OAuth); otherwise ``none`` until the server asks."""
        for connector_id, declared in connectors.items():
            keeper = self.keeper(connector_id)
            try:
                grant = await keeper.load()
            except (OSError, StorageError) as exc:  # one unreadable record must not stop the daemon
                keeper.set_state(SignIn.ERROR, f"the stored sign-in cannot be read: {_describe(exc)}")
                logger.warning("cannot load the sign-in of %s: %s", connector_id, _describe(exc))
                continue
            if grant is None and connector_id in self.store.unreadable:
                # SECURITY: a record that fails to decrypt (tampered, truncated, moved) is no sign-in.
                keeper.set_state(SignIn.NEEDED, "the stored sign-in is damaged and was not used; sign in again")
                logger.warning("the stored sign-in of %s does not decrypt; it needs a new sign-in", connector_id)
            elif keeper.state is SignIn.NONE and (declared or grant is not None):
                keeper.set_state(SignIn.NEEDED, "not signed in yet")

    # -- sign-in ---------------------------------------------------------------------------------

    async def connect(
        self,
        connector_id: str,
        *,
        url: str,
        headers: Mapping[str, str],
        client: PreRegistered | None = None,
    ) -> dict[str, Any]:
        """Start (or join) the connector's sign-in; return ``{"authorization_url", "browser_url", "flow"}``:
        ``browser_url`` is the link to open in the browser (``binding``), which leads there.

        ``authorization_url`` is None when the server let us in without one (no sign-in needed, or the
        stored grant still works). Raises ``AuthorizationRefused`` when the server is unsafe to sign in
        to (e.g. its AS lacks S256), before any URL is handed out.
        """

        async def run(flow: _Flow, keeper: GrantKeeper) -> None:
            await self._run(flow, keeper, url, dict(headers), client)

        return await self._start(connector_id, run)

    async def connect_provider(self, connector_id: str, provider: ProviderClient) -> dict[str, Any]:
        """Start (or join) the sign-in of a package's provider (``oauth-client.json``); as ``connect``."""
        return await self._start(connector_id, lambda flow, keeper: self._run_provider(flow, keeper, provider))

    async def _start(
        self, connector_id: str, run: Callable[[_Flow, GrantKeeper], Coroutine[Any, Any, None]]
    ) -> dict[str, Any]:
        flow = self._flows.get(connector_id)
        if flow is None:
            loop = asyncio.get_running_loop()
            flow = _Flow(secrets.token_urlsafe(16), connector_id, loop.create_future(), loop.create_future())
            flow.generation = self.store.generation(connector_id)
            self._flows[connector_id] = flow
            keeper = self.keeper(connector_id)
            keeper.set_state(SignIn.STARTING)
            flow.task = loop.create_task(run(flow, keeper), name=f"sign-in-{connector_id}")
            self._tasks.add(flow.task)
            flow.task.add_done_callback(self._tasks.discard)
        try:
            authorization_url = await asyncio.wait_for(asyncio.shield(flow.url), URL_TIMEOUT)
        except TimeoutError:
            raise Conflict(f"the sign-in of {connector_id} did not produce an authorization URL in time") from None
        origin = self._redirect_uri().removesuffix(CALLBACK_PATH)
        browser_url = flow.binding.link(origin) if authorization_url is not None else None
        return {
            "authorization_url": authorization_url,
            "browser_url": browser_url,
            "flow": flow.id,
            **self.public(connector_id),
        }

    def open_in_browser(self, flow_id: str, key: str) -> tuple[str, FlowCookie] | None:
        """The start link was opened: the authorization URL to send the browser to, and the cookie that
        binds the flow to it; None for a spent or unknown link, or a flow that has ended."""
        flow = next((f for f in self._flows.values() if f.id == flow_id), None)
        if flow is None or flow.result.done() or not flow.url.done() or flow.url.exception() is not None:
            return None
        url = flow.url.result()
        cookie = flow.binding.spend(key)
        return None if url is None or cookie is None else (url, cookie)

    async def _run_provider(self, flow: _Flow, keeper: GrantKeeper, provider: ProviderClient) -> None:
        storage = self._storage(flow.connector_id, generation=flow.generation)
        driver = _CallbackDriver(self, flow)
        await self._settle(
            flow, keeper, storage, sign_in(provider, storage=storage, driver=driver, redirect_uri=self._redirect_uri())
        )

    async def _settle(
        self, flow: _Flow, keeper: GrantKeeper, storage: CredentialTokenStorage, sign_in_done: Awaitable[object]
    ) -> None:
        """Run a flow's sign-in within ``FLOW_TIMEOUT``, then record how it ended and end the flow."""
        try:
            async with asyncio.timeout(FLOW_TIMEOUT):
                await sign_in_done
        except BaseException as exc:
            self._failed(flow, keeper, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            await self._succeeded(flow, keeper, storage)
        finally:
            self._finish(flow)

    async def _run(
        self, flow: _Flow, keeper: GrantKeeper, url: str, headers: dict[str, str], client: PreRegistered | None
    ) -> None:
        cid = flow.connector_id
        configured = " ".join(client.scopes) if client is not None and client.scopes else None
        extra_scope = keeper.step_up.scope_for_sign_in(keeper.granted_scope(), configured)
        storage = self._storage(
            cid,
            generation=flow.generation,
            fresh_sign_in=True,
            scope_needed=extra_scope if client is None else None,  # a pre-registered client is what it is
        )
        redirect_uri = self._redirect_uri()
        provider = build_provider(
            url,
            storage=storage,
            driver=_CallbackDriver(self, flow),
            redirect_uri=redirect_uri,
            client_name="sidecar",
            client_metadata_url=client.client_id if client is not None and client.metadata_document else None,
            extra_scope=extra_scope,
        )
        hooks = {"request": [s256_guard(provider)]}

        async def initialize() -> None:
            if client is not None and not client.metadata_document:
                await storage.seed_client(client, redirect_uri=redirect_uri)
            async with (
                httpx2.AsyncClient(
                    auth=provider, headers=headers, timeout=HTTP_TIMEOUT, event_hooks=hooks, transport=TokenCap()
                ) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()

        await self._settle(flow, keeper, storage, initialize())

    async def _succeeded(self, flow: _Flow, keeper: GrantKeeper, storage: CredentialTokenStorage) -> None:
        cid = flow.connector_id
        await keeper.load()
        if storage.stale():  # revoked after the flow stored its grant: the revoke deleted (and revokes) it
            self._failed(flow, keeper, StaleGrant(f"the sign-in of {cid} was revoked while it ran"))
            return
        if not flow.url.done():
            flow.url.set_result(None)  # no sign-in was needed
        if keeper.state is not SignIn.READY:
            keeper.set_state(SignIn.NONE)
        logger.info("sign-in of %s complete", cid)
        wider = keeper.public().get("granted_beyond_asked")
        if wider:  # kept, as the AS granted it, but never silently: shown and recorded
            logger.warning("the sign-in of %s was granted more than it asked for: %s", cid, " ".join(wider))
        self._audit("oauth.connect", connector=cid, outcome="ok", **({"granted_beyond_asked": wider} if wider else {}))
        for listener in self._listeners:
            try:  # before the flow is done: the callback page and the CLI see the connector usable
                await listener(cid, "signed_in")
            except Exception as exc:  # the sign-in stands; the connector's own error says what failed
                logger.warning("after the sign-in of %s: %s", cid, _describe(exc))

    def _finish(self, flow: _Flow) -> None:
        if flow.state_key is not None:
            self._by_state.pop(flow.state_key, None)
        if self._flows.get(flow.connector_id) is flow:
            del self._flows[flow.connector_id]
        flow.done.set()

    def _failed(self, flow: _Flow, keeper: GrantKeeper, exc: BaseException) -> None:
        reason = _describe(exc)
        if isinstance(exc, asyncio.CancelledError):
            reason = "the sign-in was cancelled"
        elif isinstance(exc, TimeoutError):
            reason = f"the sign-in was not finished within {FLOW_TIMEOUT / 60:.0f} minutes"
        failure = find_error(exc, AuthorizationRefused) or AuthorizationRefused(f"the sign-in failed: {reason}")
        if not flow.url.done():
            flow.url.set_exception(failure)
            flow.url.exception()  # retrieved: nobody may be waiting any more
        if keeper.state is SignIn.STARTING and self._flows.get(flow.connector_id) is flow:  # not revoked meanwhile
            keeper.set_state(SignIn.ERROR, str(failure))
        flow.outcome = str(failure)
        logger.warning("sign-in of %s failed: %s", flow.connector_id, failure)
        reason = preview(str(failure), 200, quote=False)
        self._audit("oauth.connect", connector=flow.connector_id, outcome="error", reason=reason)

    def _expect(self, flow: _Flow, state: str) -> None:
        flow.state_key = hashlib.sha256(state.encode()).digest()
        self._by_state[flow.state_key] = flow

    async def complete(
        self,
        *,
        state: str | None,
        code: str | None,
        iss: str | None,
        error: str | None,
        cookies: Mapping[str, str],
    ) -> Callback:
        """The browser came back to ``/oauth/callback``: hand the flow its code if this browser opened it."""
        if not state:
            return Callback(False, "This page only finishes a sidecar sign-in; it was opened without one.", "no_state")
        key = hashlib.sha256(state.encode()).digest()
        flow = self._by_state.get(key)
        if flow is None or flow.state_key is None or not hmac.compare_digest(flow.state_key, key):
            stale = "This sign-in link is not valid any more (used, expired or unknown). Run the sign-in again."
            return Callback(False, stale, "unknown_state")
        if not flow.binding.admits(cookies):
            # SECURITY: a state alone (leaked from a URL) finishes nothing and spends nothing.
            return Callback(
                False,
                "This sign-in was not started in this browser. Open the link that sidecar connectors connect "
                "gave you (or the console's Connect) in the browser you sign in with.",
                "unbound_browser",
            )
        del self._by_state[key]  # SECURITY: single use; the state is 256 random bits from the SDK
        if flow.result.done():
            return Callback(False, "This sign-in has already been answered.")
        if error:
            flow.result.set_exception(AuthorizationRefused(f"the authorization server answered {error[:64]!r}"))
        elif not code:
            flow.result.set_exception(AuthorizationRefused("the authorization server sent no code"))
        else:
            flow.result.set_result(AuthorizationCodeResult(code=code, state=state, iss=iss))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(flow.done.wait(), CALLBACK_WAIT)
        cid = flow.connector_id
        if self.keeper(cid).state is SignIn.READY:
            return Callback(True, f"sidecar is signed in to {cid}. You can close this tab.")
        return Callback(False, f"The sign-in to {cid} did not complete: {flow.outcome or 'still in progress'}")

    # -- revocation ------------------------------------------------------------------------------

    async def revoke(self, connector_id: str) -> dict[str, Any]:
        """Delete the connector's grant now, stop its calls, and revoke its tokens remotely (RFC 7009):
        those stored and those a refresh or sign-in in flight obtains (module docstring)."""
        keeper = self.keeper(connector_id)
        keeper.forget("revoked by the user")  # no refresh starts from here on
        flow = self._end_flow(connector_id)
        collected = self._revoker.collect(connector_id)
        deleted, secrets = await anyio.to_thread.run_sync(self.store.revoke_connector, connector_id)
        keeper.forget("revoked by the user")  # nor does a grant read before the delete stay in memory
        collected.extend(grants_in(connector_id, secrets))
        for listener in self._listeners:
            await listener(connector_id, "revoked")
        in_flight = asyncio.ensure_future(self._in_flight_ended(keeper, flow))
        done, _ = await asyncio.wait({in_flight}, timeout=SETTLE_TIMEOUT)
        if in_flight in done:
            remote = await self._revoker.finish(connector_id, collected)
        else:
            logger.warning("a refresh or sign-in of %s is still in flight; what it obtains is revoked", connector_id)
            remote = "retrying"
            late = asyncio.wait_for(in_flight, LATE_TIMEOUT)
            self._revoker.spawn(self._revoker.finish_later(connector_id, late, collected))
        self._audit("oauth.revoke", connector=connector_id, records=deleted, remote=remote)
        return {"revoked": connector_id, "deleted": deleted, "remote": remote, **keeper.public()}

    def _end_flow(self, connector_id: str) -> _Flow | None:
        """A pending sign-in ends as revoked: its link stops working at once, a new ``connect`` starts
        afresh, and one in its token exchange ends by itself (its write is refused; its tokens revoked)."""
        flow = self._flows.pop(connector_id, None)
        if flow is None:
            return None
        if flow.state_key is not None:
            self._by_state.pop(flow.state_key, None)
        if not flow.result.done():
            flow.result.set_exception(AuthorizationRefused("the sign-in was revoked"))
            flow.result.exception()  # retrieved: the flow may never ask for it
        return flow

    @staticmethod
    async def _in_flight_ended(keeper: GrantKeeper, flow: _Flow | None) -> None:
        if flow is not None:
            await flow.done.wait()
        await keeper.settled()

    def _discarded(self, connector_id: str, grant: StoredGrant) -> None:
        """A write of ours was refused: the grant was revoked since it began. Its tokens end at the AS."""
        self._revoker.discarded(connector_id, grant)

    # -- lifecycle -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel pending sign-ins and background revocations (bounded: they only wait on the network)."""
        pending = list(self._tasks)  # every sign-in's task, also one a revoke ended
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        await self._revoker.close()


class _CallbackDriver:
    """Hands the authorization URL to ``connect``'s caller, then waits for ``/oauth/callback``."""

    def __init__(self, broker: Broker, flow: _Flow) -> None:
        self._broker = broker
        self._flow = flow

    async def authorize(self, url: str) -> AuthorizationCodeResult:
        state = parse_qs(urlsplit(url).query).get("state", [None])[0]
        if not state:
            raise AuthorizationRefused("the authorization URL carries no state")
        if self._flow.result.done():  # revoked before it got here: hand out no link
            raise AuthorizationRefused("the sign-in was revoked")
        self._broker._expect(self._flow, state)
        if not self._flow.url.done():
            self._flow.url.set_result(url)
        return await self._flow.result  # bounded by the flow's own timeout


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return preview(f"{type(exc).__name__}: {exc}", 200, quote=False)
