"""One raw JSON-RPC connection to a connector, for the faithful relay (``edge/relay.py``).

The relay forwards messages as they are, so it talks to the connector below the SDK's typed client:
a ``JSONRPCDispatcher`` over the connector's stdio (a ``ConnectorProcess`` of its own) or over a
Streamable HTTP client. The dispatcher mints its own request ids and maps progress tokens and
cancellations to them, which is exactly the id mapping a relay needs.

What the connector sends on its own (server→client requests and notifications) goes to a *sink*. A
notification that names the request it belongs to (a 2026-07-28 subscription event names its
``subscriptions/listen``) goes to that request's client exchange, under the client's own id. Anything
else goes to the client exchange waiting on this connection, or to the client connection's standalone
channel when none is (``RelayedConnection.serving``): stdio carries nothing that ties a server→client request
or a log line to the request that caused it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import anyio
import httpx2
from mcp.shared.dispatcher import CallOptions, DispatchContext
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp.shared.transport_context import TransportContext
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, METHOD_NOT_FOUND, REQUEST_TIMEOUT, RequestId

from sidecar.connectors.failures import FailureLog
from sidecar.connectors.launch import (
    CALL_TIMEOUT,
    HttpAuthSource,
    LaunchContext,
    LaunchPlan,
    http_transport,
    launch_plan,
)
from sidecar.connectors.manifest.sources import ConnectorSpec
from sidecar.connectors.rawcall import send_to_connector
from sidecar.connectors.stdio.process import ConnectorProcess, ProcessLimits
from sidecar.errors import ToolError, find_error
from sidecar.text import preview

__all__ = ["RelayedConnection", "RelayedConnections", "Sink"]

logger = logging.getLogger(__name__)

FailureCallback = Callable[[str, list[str]], object]
"""Called with (reason, stderr tail) when a connection's own process fails."""

_HANDLED_BY_DISPATCHER: Final = frozenset({"notifications/progress", "notifications/cancelled"})
"""Correlated by the dispatcher itself (progress to its caller, cancel to its handler): never relayed raw."""


class Sink(Protocol):
    """Where a connector's own traffic goes: the SDK's ``Outbound`` shape (a dispatch context or connection)."""

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]: ...

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None: ...


class RelayedConnection:
    """A connector connection owned by one holder task; ``request``/``notify`` may be called from any task."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        name: str,
        limits: ProcessLimits | None = None,
        on_failure: FailureCallback | None = None,
        auth: httpx2.Auth | None = None,
    ) -> None:
        """``on_failure`` is called once with the reason and the stderr tail if its process fails (ends
        without ``close()`` asking it to), after the process has been stopped. ``auth`` authenticates a
        Streamable HTTP connection (the OAuth broker's, shared with the pool)."""
        self.name = name
        self._auth = auth
        self._on_failure = on_failure
        self._plan = plan
        self._limits = limits or ProcessLimits()
        self._dispatcher: JSONRPCDispatcher[TransportContext] | None = None
        self._process: ConnectorProcess | None = None
        self._stop = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None
        self._sinks: list[Sink] = []
        self._ids = itertools.count(1)
        self._requests: dict[str, tuple[Sink, RequestId]] = {}
        """Our id for a request in flight → the client exchange that sent it, and the client's own id."""
        self.standalone: Sink | None = None
        self._lost = False
        self.last_used = time.monotonic()
        self._in_flight = 0

    @property
    def idle(self) -> bool:
        """No request of a client is waiting on it (an open GET stream does not count)."""
        return self._in_flight == 0

    @property
    def alive(self) -> bool:
        if self._lost or self._holder is None or self._holder.done() or self._dispatcher is None:
            return False
        return self._process is None or not self._process.exited.is_set()

    async def start(self, start_timeout: float) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(self._hold(ready), name=f"relay-{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), start_timeout)
        except TimeoutError:
            await self.close()
            raise ToolError(f"connector {self.name} did not start within {start_timeout:g}s") from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the connection; a process of its own goes through the full stop escalation."""
        self._stop.set()
        if self._holder is not None:
            await asyncio.wait({self._holder})

    async def request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        origin: tuple[Sink, RequestId] | None = None,
        within: float | None = None,
    ) -> dict[str, Any]:
        """Send one request under an id of ours; ``origin`` is the client exchange and id it came from.

        ``within`` bounds the answer (seconds; ``CALL_TIMEOUT`` unless given: the handshake has the start's bound).
        """
        bound = CALL_TIMEOUT if within is None else within
        dispatcher = self._dispatcher
        if dispatcher is None:
            raise MCPError(code=INTERNAL_ERROR, message=f"connector {self.name} is not running")
        self.last_used = time.monotonic()
        # A string id that never parses as an integer: unique for the connection's life, never reused.
        ours = f"sidecar-{next(self._ids)}"
        options: CallOptions = {**(opts or {}), "request_id": ours}
        if origin is not None:
            self._requests[ours] = origin
        self._in_flight += 1
        try:
            return await send_to_connector(
                method,
                params,
                dispatcher=dispatcher,
                lane=self._process.lane if self._process is not None else None,
                options=options,
                within=bound,
            )
        except TimeoutError:
            raise MCPError(code=REQUEST_TIMEOUT, message=f"{method} took longer than {bound:.0f}s") from None
        except MCPError as exc:
            if exc.error.code != CONNECTION_CLOSED:
                raise  # the connector's own error, as it sent it
            self._lost = True  # the connection is gone for good, even before the process is reaped
            reason = (self._process.exit_reason if self._process is not None else None) or "connection closed"
            raise MCPError(code=INTERNAL_ERROR, message=f"connector {self.name} stopped ({reason})") from None
        finally:
            self._in_flight -= 1
            self.last_used = time.monotonic()
            self._requests.pop(ours, None)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if self._dispatcher is not None:
            await self._dispatcher.notify(method, params, opts)

    @contextlib.contextmanager
    def serving(self, sink: Sink) -> Any:
        """While a downstream exchange waits on this connection, what the connector sends goes to it."""
        self._sinks.append(sink)
        try:
            yield
        finally:
            self._sinks.remove(sink)

    def _sink(self) -> Sink | None:
        return self._sinks[-1] if self._sinks else self.standalone

    # -- the connector's own traffic -------------------------------------------------------------

    async def _on_request(
        self, dctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        sink = self._sink()
        if sink is None:
            raise MCPError(code=METHOD_NOT_FOUND, message=f"{method}: no client is connected to answer it")
        return await sink.send_raw_request(method, params)

    async def _on_notify(
        self, dctx: DispatchContext[TransportContext], method: str, params: Mapping[str, Any] | None
    ) -> None:
        if method in _HANDLED_BY_DISPATCHER:
            return
        meta = params.get("_meta") if params is not None else None
        subscription = meta.get(SUBSCRIPTION_ID_META_KEY) if isinstance(meta, Mapping) else None
        origin = self._requests.get(str(subscription)) if subscription is not None else None
        if origin is not None and params is not None and isinstance(meta, Mapping):
            exchange, client_id = origin
            await exchange.notify(method, {**params, "_meta": {**meta, SUBSCRIPTION_ID_META_KEY: client_id}})
            return
        sink = self._sink()
        if sink is not None:
            await sink.notify(method, params)

    # -- the holder ------------------------------------------------------------------------------

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with self._transport() as (read, write):
                dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(read, write)
                async with anyio.create_task_group() as group:
                    await group.start(dispatcher.run, self._on_request, self._on_notify)
                    self._dispatcher = dispatcher
                    ready.set_result(None)
                    await self._until_stopped_or_closed(dispatcher)
                    group.cancel_scope.cancel()
        except Exception as exc:
            reason = (self._process.exit_reason if self._process else None) or f"{type(exc).__name__}: {exc}"
            reason = preview(reason, 200, quote=False)
            refused = find_error(exc, ToolError)  # the auth's own verdict (a sign-in is needed) is the reason
            if refused is not None:
                reason = str(refused)
            if not ready.done():
                ready.set_exception(refused or ToolError(f"connector {self.name} failed to start: {reason}"))
            if not self._report_failure(reason):
                logger.warning("relay to connector %s ended: %s", self.name, reason)
        else:
            self._report_failure(None)
        finally:
            self._dispatcher = None
            if self._plan.release is not None:
                self._plan.release()  # the process is gone: so is its internal-API credential
            if not ready.done():
                ready.set_exception(ToolError(f"connector {self.name} stopped before it was ready"))

    def _report_failure(self, reason: str | None) -> bool:
        """Report a process that ended without ``close()`` asking it to (it has been stopped by now, so its
        stderr tail is complete); whether there was one to report."""
        process = self._process
        if process is None or not (process.failed or not self._stop.is_set()):
            return False
        if self._on_failure is not None:
            self._on_failure(reason or process.exit_reason or "connection closed", process.stderr_tail)
        return True

    async def _until_stopped_or_closed(self, dispatcher: JSONRPCDispatcher[TransportContext]) -> None:
        stop = asyncio.create_task(self._stop.wait())
        exited = asyncio.create_task(self._process.exited.wait()) if self._process is not None else None
        waiting = {stop} | ({exited} if exited is not None else set())
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiting:
                task.cancel()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        plan = self._plan
        if plan.url is not None:
            async with http_transport(plan, auth=self._auth) as streams:
                yield streams
            return
        process = ConnectorProcess(plan.argv, env=plan.env, cwd=plan.cwd, limits=self._limits, name=self.name)
        self._process = process
        async with process, process.transport() as streams:
            yield streams


class RelayedConnections:
    """Every relayed connection, by (sidecar session, connector): opened, counted, reaped, closed.

    A 2025-era MCP session opens one of its own (``open``; the relay drops it when that MCP session
    ends); 2026-07-28 requests share one per (session, connector) (``shared``). They count against the
    same caps as the pool's processes (``check_caps``) and die with their session or their trust.

    Most clients never send DELETE when they crash or reconnect, so connections are bounded per session
    too: a session holds at most ``per_session`` of one connector, and at any cap the least recently
    used idle connection *of the same session* gives way before anything is refused. Connections idle
    for ``idle_seconds`` are closed like the pool's processes.
    """

    def __init__(
        self,
        *,
        context: Callable[[str, str], LaunchContext],
        start_timeout: float,
        check_caps: Callable[[str], None],
        admit: Callable[[ConnectorSpec], None],
        give_way: Callable[[str], Awaitable[None]] | None = None,
        per_session: int = 4,
        idle_seconds: float = 900.0,
        failures: FailureLog | None = None,
        http_auth: HttpAuthSource | None = None,
    ) -> None:
        """``failures`` keeps each connector's last failed process (its reason and stderr) for ``connectors show``;
        ``http_auth`` authenticates remote (Streamable HTTP) connectors, as it does the pool's;
        ``give_way`` stops a warm spare of the pool's when one holds the place a connection needs."""
        self._context = context
        self._http_auth = http_auth
        self._admit = admit
        self._failures = failures if failures is not None else FailureLog()
        self._start_timeout = start_timeout
        self._check_caps = check_caps
        self._give_way = give_way
        self._per_session = per_session
        self._idle_seconds = idle_seconds
        self._open: dict[RelayedConnection, tuple[str, str]] = {}
        self._shared: dict[tuple[str, str], RelayedConnection] = {}
        self._starting: dict[tuple[str, str], asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None

    def running(self, connector_id: str | None = None) -> int:
        """Live connections (a dead one stays registered until its MCP session ends, but runs nothing)."""
        return sum(
            1
            for relayed, (_, cid) in self._open.items()
            if relayed.alive and (connector_id is None or cid == connector_id)
        )

    def connected(self, connector_id: str) -> set[str]:
        """The sessions with a live relayed connection to the connector."""
        return {sid for relayed, (sid, cid) in self._open.items() if cid == connector_id and relayed.alive}

    async def open(self, session_id: str, workspace: str, spec: ConnectorSpec) -> RelayedConnection:
        """A new connection of the session's own; ``ToolError`` when a cap is reached and nothing of this
        session can give way, when its trust no longer holds on disk (``admit``), or it cannot start."""
        self._admit(spec)
        auth = None
        if spec.launch.transport == "http" and self._http_auth is not None:
            self._http_auth.require(spec.id)  # a connector that needs a sign-in fails fast, with the remedy
            auth = self._http_auth.auth_for(spec.id)
        await self._make_room(session_id, spec.id)
        relayed = RelayedConnection(
            launch_plan(spec, self._context(session_id, workspace)),
            name=spec.id,
            on_failure=lambda reason, stderr: self._failures.record(spec.id, session_id, reason=reason, stderr=stderr),
            auth=auth,
        )
        self._open[relayed] = (session_id, spec.id)
        try:
            await relayed.start(self._start_timeout)
        except BaseException:
            self._open.pop(relayed, None)
            raise
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="relay-idle-reaper")
        return relayed

    async def _make_room(self, session_id: str, connector_id: str) -> None:
        """A warm spare gives way first (it serves nobody yet); then this session's least recently used
        idle connections close until one more fits every cap."""
        if self._give_way is not None:
            await self._give_way(connector_id)
        while True:
            mine = [u for u, (sid, cid) in self._open.items() if sid == session_id and cid == connector_id]
            try:
                if sum(1 for u in mine if u.alive) >= self._per_session:
                    raise ToolError(
                        f"this session already holds {self._per_session} connections to {connector_id}; "
                        "end an MCP session (DELETE) or wait until one is idle"
                    )
                self._check_caps(connector_id)
                return
            except ToolError:
                # Prefer this connector's own; at the total cap any connector of this session will do.
                idle = [u for u in mine if u.idle] or [
                    u for u, (sid, _) in self._open.items() if sid == session_id and u.idle
                ]
                if not idle:
                    raise
                oldest = min(idle, key=lambda u: u.last_used)
                logger.info(
                    "closing the least recently used idle connection to %s of a session at its cap", oldest.name
                )
                await self.drop(oldest)

    async def shared(self, session_id: str, workspace: str, spec: ConnectorSpec) -> RelayedConnection:
        """The session's one connection to ``spec`` for self-contained (2026-07-28) requests."""
        key = (session_id, spec.id)
        async with self._starting.setdefault(key, asyncio.Lock()):
            relayed = self._shared.get(key)
            if relayed is not None and relayed.alive:
                return relayed
            if relayed is not None:
                await self.drop(relayed)
            relayed = await self.open(session_id, workspace, spec)
            self._shared[key] = relayed
            return relayed

    async def drop(self, relayed: RelayedConnection) -> None:
        key = self._open.pop(relayed, None)
        if key is not None and self._shared.get(key) is relayed:
            del self._shared[key]
        await relayed.close()

    async def close_session(self, session_id: str) -> None:
        await self._close_where(lambda key: key[0] == session_id)
        for key in [key for key in self._starting if key[0] == session_id]:
            del self._starting[key]

    async def close_connector(self, connector_id: str) -> None:
        await self._close_where(lambda key: key[1] == connector_id)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self._close_where(lambda key: True)

    async def _close_where(self, match: Callable[[tuple[str, str]], bool]) -> None:
        doomed = [relayed for relayed, key in self._open.items() if match(key)]
        await asyncio.gather(*(self.drop(relayed) for relayed in doomed))

    async def _reap(self) -> None:
        interval = max(1.0, min(60.0, self._idle_seconds / 4))
        while self._open:
            await asyncio.sleep(interval)
            now = time.monotonic()
            stale = [u for u in self._open if u.idle and now - u.last_used > self._idle_seconds]
            for relayed in stale:
                logger.info("closing a relayed connection to %s idle for %.0fs", relayed.name, now - relayed.last_used)
            await asyncio.gather(*(self.drop(relayed) for relayed in stale))
