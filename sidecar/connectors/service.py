"""Connectors as one service: the manager, the processes and connections, the proxied tools, in step.

Trusting a connector probes it for its tools and registers them; untrusting it, or a change of its
config or package, stops its processes and relayed connections in every session and takes its tools
out of the pool; a session that ends takes its processes with it. Every change of what a session may
see is announced through ``notify`` (the MCP edge sends ``tools/list_changed``). The service also
registers the ``list_connectors`` tool: the connectors a session can use, from the bus's own registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sidecar.auth.routes import RouteRegistry
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.connectors.catalog import ConnectorCatalog
from sidecar.connectors.failures import FailureLog
from sidecar.connectors.manager import Connector, ConnectorManager, ConnectorState
from sidecar.connectors.pool import ConnectorPool, HttpAuthSource, LaunchContext, PoolLimits
from sidecar.connectors.proxy import ConnectorTools
from sidecar.connectors.upstream import Upstreams
from sidecar.errors import SidecarError
from sidecar.names import connector_route
from sidecar.store.trust import TrustStore

__all__ = ["ConnectorService"]

logger = logging.getLogger(__name__)

Notify = Callable[[str | None], None]
"""Announce a change of visible tools: to one session (its id) or to every session (None)."""


class ConnectorService:
    def __init__(
        self,
        *,
        manager: ConnectorManager,
        trust: TrustStore,
        registry: ToolRegistry,
        cache_dir: Path,
        context: Callable[[str, str], LaunchContext],
        notify: Notify,
        routes: RouteRegistry,
        limits: PoolLimits,
        http_auth: HttpAuthSource | None = None,
    ) -> None:
        self.manager = manager
        self._routes = routes
        self._notify = notify
        # The pool's processes and the relay's connections count against the same caps (``running``), and
        # report their failed processes to the same log (``connectors show``).
        self.failures = FailureLog()
        self.pool = ConnectorPool(
            limits=limits,
            on_change=lambda session_id, _: notify(session_id),
            count=self.running,
            admit=manager.admit,
            failures=self.failures,
            http_auth=http_auth,
        )
        self.upstreams = Upstreams(
            context=context,
            start_timeout=limits.start_timeout,
            check_caps=self.pool.check_caps,
            admit=manager.admit,
            per_session=limits.per_session,
            idle_seconds=limits.idle_seconds,
            failures=self.failures,
        )
        self.tools = ConnectorTools(
            registry=registry,
            manager=manager,
            trust=trust,
            pool=self.pool,
            cache_dir=cache_dir,
            context=context,
            notify_drift=lambda: notify(None),
        )
        self.catalog = ConnectorCatalog(manager=manager, pool=self.pool, offers=self.tools.offers, context=context)
        self._tasks: set[asyncio.Task[Any]] = set()
        manager.subscribe(self._on_connector)
        _install_list_connectors(registry, self)

    def running(self, connector_id: str | None = None) -> int:
        """Processes and relayed connections alive now, of one connector or of all."""
        return self.pool.running(connector_id) + self.upstreams.running(connector_id)

    def public(self, connector: Connector, *, detail: bool = False) -> dict[str, object]:
        """What the control API shows; in detail also ``last_failure``: the latest of its processes that
        failed, in any session (session, time, reason, last stderr lines), or ``None``."""
        body = connector.public(running=self.running(connector.id), detail=detail)
        if detail:
            failure = self.failures.last(connector.id)
            body["last_failure"] = failure.public() if failure is not None else None
        return body

    def start(self) -> None:
        """Register the cached tools of the connectors trusted in earlier runs (spawns nothing)."""
        self.tools.sync()
        for connector in self.manager.trusted():
            self._mount(connector.id)

    def _mount(self, connector_id: str) -> None:
        """``/mcp/connectors/<id>`` with its own route token (contract §4), for hosts that want one connector."""
        name = connector_route(connector_id)
        if self._routes.get(name) is None:
            self._routes.register(name, path=f"/mcp/connectors/{connector_id}")

    def _unmount(self, connector_id: str) -> None:
        name = connector_route(connector_id)
        if self._routes.get(name) is not None:
            self._routes.unregister(name)  # the token dies and its in-flight requests are aborted

    async def trust(self, connector_id: str) -> Connector:
        """Trust, then learn the connector's tools; a connector that fails to start is left in ``error``."""
        connector = self.manager.trust(connector_id)
        try:
            await self.tools.learn(connector)
        except SidecarError as exc:
            connector.state = ConnectorState.ERROR
            connector.error = str(exc)
            logger.warning("connector %s trusted but not usable: %s", connector_id, exc)
        else:
            connector.error = None
            self._mount(connector_id)
        self._notify(None)
        return connector

    async def untrust(self, connector_id: str) -> Connector:
        connector = self.manager.untrust(connector_id)
        await self._withdraw(connector_id)
        return connector

    async def disconnect(self, connector_id: str) -> None:
        """Stop the connector's processes and connections in every session, aborting their calls; trust,
        tools and route stay (its credentials were revoked: the next call fails fast or starts afresh)."""
        await self.upstreams.close_connector(connector_id)
        await self.pool.stop_connector(connector_id)

    def session_ended(self, session_id: str) -> None:
        self._background(self.pool.stop_session(session_id))
        self._background(self.upstreams.close_session(session_id))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.upstreams.close()
        await self.pool.close()

    def _on_connector(self, connector: Connector, event: str) -> None:
        if event in ("untrusted", "changed"):
            # SECURITY: what is no longer trusted stops now, in every session, and leaves the pool.
            self._background(self._withdraw(connector.id))

    async def _withdraw(self, connector_id: str) -> None:
        self._unmount(connector_id)
        await self.upstreams.close_connector(connector_id)
        await self.pool.stop_connector(connector_id)
        self.tools.sync()
        self._notify(None)

    def _background(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _install_list_connectors(registry: ToolRegistry, service: ConnectorService) -> None:
    @registry.tool(
        name="list_connectors",
        title="List connectors",
        description="The connectors (MCP servers behind sidecar) this session can use, and their states.",
        risk=Risk.LOW,
    )
    async def list_connectors(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        found = [service.public(c) for c in service.manager.trusted()]
        text = "\n".join(f"{c['id']}: {c['state']}" for c in found) or "no connectors are available"
        return ToolOutput(text=text, structured={"connectors": found})
