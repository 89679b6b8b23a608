"""Connectors as one service: the manager, the processes and connections, the proxied tools, in step.

Trusting a connector probes it for its tools and registers them; untrusting it, or a change of its
config or package, stops its processes and relayed connections in every session and takes its tools
out of the pool; a session that ends takes its processes with it. Every change of what a session may
see is announced through ``notify`` (the MCP edge sends ``tools/list_changed``). The service also
registers the ``list_connectors`` tool: the connectors a session may use (``policy.reaches_connector``)
and, of each, the tools that session may see; a connector it may not use is never named.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sidecar.auth.routes import RouteRegistry
from sidecar.auth.sessions import Session, SessionStore
from sidecar.bus.billing import BillableTool, BillingGate, read_source
from sidecar.bus.policy import Phase, Verdict, decide, reaches_connector
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.connectors.catalog import ConnectorCatalog
from sidecar.connectors.failures import FailureLog
from sidecar.connectors.launch import HttpAuthSource, LaunchContext
from sidecar.connectors.manager import Connector, ConnectorManager, ConnectorState
from sidecar.connectors.manifest.sources import ConnectorSpec
from sidecar.connectors.pool import ConnectorPool, PoolLimits
from sidecar.connectors.proxy import ConnectorTools, Deferral, billing_sources
from sidecar.connectors.relayed import RelayedConnections
from sidecar.connectors.snapshot import changes_since_trust, record_trusted
from sidecar.connectors.stdio.sandbox import Sandbox
from sidecar.errors import SidecarError, ToolError
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
        sessions: SessionStore,
        billing: BillingGate | None = None,
        deferral: Deferral | None = None,
        http_auth: HttpAuthSource | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.manager = manager
        self.sandbox = sandbox
        self._trust = trust
        self._cache_dir = cache_dir
        self._routes = routes
        self._notify = notify
        self._registry = registry
        self._sessions = sessions
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
            prepare=self._prepare,  # the tools are built below, with the pool
        )
        self.relayed = RelayedConnections(
            context=context,
            start_timeout=limits.start_timeout,
            check_caps=self.pool.check_caps,
            admit=manager.admit,
            give_way=self.pool.spares.make_room,
            per_session=limits.per_session,
            idle_seconds=limits.idle_seconds,
            failures=self.failures,
            http_auth=http_auth,
        )
        self.tools = ConnectorTools(
            registry=registry,
            manager=manager,
            trust=trust,
            pool=self.pool,
            cache_dir=cache_dir,
            context=context,
            notify_drift=lambda: notify(None),
            billing=billing,
            deferral=deferral,
            sandbox=sandbox,
        )
        self.catalog = ConnectorCatalog(manager=manager, pool=self.pool, offers=self.tools.offers, context=context)
        self._tasks: set[asyncio.Task[Any]] = set()
        manager.subscribe(self._on_connector)
        _install_list_connectors(registry, self)

    async def _prepare(self, spec: ConnectorSpec, client: Any) -> None:
        await self.tools.vet(spec, client)

    def running(self, connector_id: str | None = None) -> int:
        """Processes and relayed connections alive now, of one connector or of all."""
        return self.pool.running(connector_id) + self.relayed.running(connector_id)

    def connected(self, connector_id: str) -> set[str]:
        """The sessions that have the connector connected now: trusted, with a pool process or a relayed
        connection up. One that lost its trust has none, though its processes may take a moment to stop
        (``running`` counts them until they have): no call reaches them any more."""
        if not self.manager.get(connector_id).trusted:
            return set()
        return self.pool.connected(connector_id) | self.relayed.connected(connector_id)

    def public(self, connector: Connector, *, detail: bool = False) -> dict[str, object]:
        """What the control API shows; in detail also ``billable`` (its tools that cost money, by its own
        names, from its ``high-credit-tools.json``), ``billing_problem`` (why that file makes every one of
        its tools ask), ``process`` (``shared``: one process serves every session; else ``session``),
        ``spares`` (its warm spare processes ready now, counted in ``running``) and ``last_failure``: the
        latest of its processes that failed, in any session (session, time, reason, last stderr lines), or
        ``None``."""
        body = connector.public(
            running=self.running(connector.id), connected=len(self.connected(connector.id)), detail=detail
        )
        body["sandbox"] = self.sandboxing(connector.spec)
        if detail:
            billable: dict[str, BillableTool] = {}
            problems = []
            for source in billing_sources(connector.spec):
                tools, problem = read_source(source)
                billable = {**tools, **billable}  # the first source that lists a tool decides, as in the gate
                problems += [problem] if problem is not None else []
            body["billable"] = {name: tool.model_dump(by_alias=True) for name, tool in sorted(billable.items())}
            body["billing_problem"] = f"every tool asks: {'; '.join(problems)}" if problems else None
            failure = self.failures.last(connector.id)
            body["last_failure"] = failure.public() if failure is not None else None
            body["process"] = "shared" if self.pool.shares(connector.spec) else "session"
            body["spares"] = self.pool.spares.ready(connector.id)
        return body

    def sandboxing(self, spec: ConnectorSpec) -> dict[str, object] | None:
        """What the sandbox shows a stdio connector (``mode``: ``on``; ``off``, opted out; ``none``, no
        sandbox here; ``refused``, it requires one there is not), or ``None``: no process of ours."""
        if spec.launch.transport != "stdio" or self.sandbox is None:
            return None
        return self.sandbox.describe(spec.id, spec.sandbox, network=spec.network)

    def _trust_facts(self, spec: ConnectorSpec) -> dict[str, object]:
        """What the trust audit record says of how it will run: ``sandbox`` on, off, none or refused."""
        described = self.sandboxing(spec)
        return {"sandbox": described["mode"]} if described is not None else {}

    def changes_since_trust(self, connector: Connector) -> list[str] | None:
        """What differs from what the connector was last trusted as (one line per field), or None if
        unknown; an unchanged trusted connector has none."""
        trusted = {r.key for r in self._trust.records_named(connector.id)}
        return changes_since_trust(self._cache_dir, connector.spec, trusted)

    def usable(self, session: Session) -> list[Connector]:
        """The trusted connectors this session may use (its grant and its network permission)."""
        return [c for c in self.manager.trusted() if reaches_connector(session, c.id, needs_network=c.spec.network)]

    def of_session(self, session_id: str) -> list[dict[str, object]]:
        """What ``list_connectors`` answers the live session ``session_id``."""
        session = self._sessions.alive(session_id)
        if session is None:
            raise ToolError("this session has ended")
        return [self.for_session(session, c) for c in self.usable(session)]

    def for_session(self, session: Session, connector: Connector) -> dict[str, object]:
        """One connector as an agent of ``session`` sees it: no other session's processes, and only the
        tools this session may see."""
        tools = [
            name
            for name in self.tools.registered(connector.id)
            if decide(session, self._registry.get(name), Phase.LIST).verdict is not Verdict.DENY
        ]
        if session.id in self.connected(connector.id):
            state = ConnectorState.CONNECTED
        elif (error := self.pool.error(session.id, connector.id)) is not None:
            state = ConnectorState.ERROR
        else:
            state = ConnectorState.DISCONNECTED
        return {
            "id": connector.id,
            "name": connector.spec.name,
            "description": connector.spec.description,
            "state": state.value,
            "error": error if state is ConnectorState.ERROR else None,
            "tools": tools,
        }

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
        connector = self.manager.trust(connector_id, facts=self._trust_facts)
        record_trusted(self._cache_dir, connector.spec, connector.key)
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
        await self.relayed.close_connector(connector_id)
        await self.pool.stop_connector(connector_id)

    def session_ended(self, session_id: str) -> None:
        self._background(self.pool.stop_session(session_id))
        self._background(self.relayed.close_session(session_id))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.relayed.close()
        await self.pool.close()

    def _on_connector(self, connector: Connector, event: str) -> None:
        if event in ("untrusted", "changed"):
            # SECURITY: what is no longer trusted stops now, in every session, and leaves the pool.
            self._background(self._withdraw(connector.id))
        elif event == "updated":
            self.tools.sync()  # its tools again, as it now declares them (deferral)
            self._notify(None)
        elif event == "restored":
            self.tools.sync()  # the tools cached under the key it is back to
            self._mount(connector.id)
            self._notify(None)

    async def _withdraw(self, connector_id: str) -> None:
        self._unmount(connector_id)
        await self.relayed.close_connector(connector_id)
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
        found = service.of_session(call.session_id)
        text = "\n".join(_connector_line(c) for c in found) or "no connectors are available to this session"
        return ToolOutput(text=text, structured={"connectors": found})


def _connector_line(connector: dict[str, object]) -> str:
    tools = connector["tools"]
    listed = ", ".join(str(t) for t in tools) if isinstance(tools, list) and tools else "no tools it may use"
    return f"{connector['id']} ({connector['name']}): {connector['state']}; {listed}"
