"""Connector tools in the pool: ``mcp__<id>__<tool>``, proxied to the session's own connector process.

What a trusted connector offers is learned once per trust key by a *probe* (a process started with an
empty scratch workspace and no session), cached in ``<state>/connectors/`` so that listing tools for a
new session spawns nothing (contract §7). The probe's tool definitions are fingerprinted into the trust
store; a later listing whose schema or description differs withholds that tool until the user trusts
the connector again (rug-pull protection), and ``connectors show`` names the drift.

Each tool is registered with its risk from ``connector.json`` (unknown third-party tools: MEDIUM), the
network it needs (all of them, unless the connector declares it works offline) and whether it is
deferred (``Deferral``), goes through the one decision of the tool pool like any other, and is called
through ``ConnectorPool``. A package's or plugin's ``high-credit-tools.json`` joins the billable gate
for that connector's scope while its tools are in the pool.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from mcp import types
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED

from sidecar.bus.billing import BillingGate, ManifestSource
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.connectors.launch import CALL_TIMEOUT, LaunchContext, LaunchPlan, launch_plan
from sidecar.connectors.manager import Connector, ConnectorManager
from sidecar.connectors.manifest.sources import BILLING_FILE, ConnectorSpec
from sidecar.connectors.pool import ConnectorPool
from sidecar.connectors.rawcall import call_tool_raw, tool_result
from sidecar.connectors.sharing.shared import SessionView
from sidecar.connectors.stdio.lane import RawLane
from sidecar.connectors.stdio.sandbox import Sandbox
from sidecar.errors import StorageError, ToolError
from sidecar.names import MAX_TOOL_NAME, connector_route, connector_tool
from sidecar.store.files import read_json, write_json
from sidecar.store.trust import TrustStore, tool_fingerprint
from sidecar.text import preview

__all__ = ["ConnectorTools", "Deferral", "billing_sources", "withheld_message"]

logger = logging.getLogger(__name__)

PROBE_SESSION: Final = "probe"


def withheld_message(connector: Connector, tool: str) -> str:
    """What a call to a tool that changed since trust (rug-pull check) is told, on every route."""
    return (
        f"{tool} changed since {connector.id} was trusted ({connector.tool_drift[tool]}); it is withheld "
        f"until the user reviews it and runs: sidecar connectors trust {connector.id}"
    )


@dataclass(frozen=True, slots=True)
class Deferral:
    """Which connector tools stay out of ``tools/list`` (``[tools]`` settings, then what the connector says)."""

    default: bool = True
    """``defer_connectors``: a connector that does not say (``defer_loading``) has its tools deferred."""
    direct: frozenset[str] = frozenset()
    """``direct_connectors``: connectors whose tools are listed directly, whatever they say."""

    def deferred(self, spec: ConnectorSpec, tool: str) -> bool:
        if spec.id in self.direct:
            return False
        return spec.deferred(tool, default=self.default)


async def _raw_call(
    client: Any, tool: str, arguments: Mapping[str, Any], relay: Any, lane: RawLane | None
) -> dict[str, Any]:
    """``tools/call`` raw on the connector's own client session (or its raw lane); a shared process's
    session view tracks it as its session's (aborted when that session ends), since the raw call reaches
    past the view. Bounded by ``CALL_TIMEOUT`` (``TimeoutError``)."""
    if isinstance(client, SessionView):
        request = call_tool_raw(client.client, tool, arguments, within=CALL_TIMEOUT, on_progress=relay, lane=lane)
        return cast(dict[str, Any], await client.track(request))
    return await call_tool_raw(client, tool, arguments, within=CALL_TIMEOUT, on_progress=relay, lane=lane)


def billing_sources(spec: ConnectorSpec) -> list[ManifestSource]:
    """What says which of a connector's tools cost money, names as it names them: a package's or plugin's
    ``high-credit-tools.json`` (optional: without one it is free; failing closed when present but
    unsound), and what its ``mcp.json`` entry declares (``billable``)."""
    scope, prefix = connector_route(spec.id), connector_tool(spec.id, "")
    sources = []
    if spec.root is not None:
        sources.append(ManifestSource(scope=scope, path=spec.root / BILLING_FILE, required=False, prefix=prefix))
    if spec.tool_billing:
        declared = tuple(sorted(spec.tool_billing.items()))
        sources.append(ManifestSource(scope=scope, path=spec.origin, required=False, prefix=prefix, declared=declared))
    return sources


def _cache_file(directory: Path, key: str) -> Path:
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.tools.json"


class ConnectorTools:
    """Keeps the registry's connector tools in step with trust, and runs their calls."""

    def __init__(
        self,
        *,
        registry: ToolRegistry,
        manager: ConnectorManager,
        trust: TrustStore,
        pool: ConnectorPool,
        cache_dir: Path,
        context: Callable[[str, str], LaunchContext],
        notify_drift: Callable[[], None] = lambda: None,
        billing: BillingGate | None = None,
        deferral: Deferral | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self._registry = registry
        self._sandbox = sandbox
        self._billing = billing
        self._deferral = deferral or Deferral()
        self._specs: dict[str, ConnectorSpec] = {}  # connector id -> the spec its tools were registered from
        self._manager = manager
        self._trust = trust
        self._pool = pool
        self._cache_dir = cache_dir
        self._context = context
        self._registered: dict[str, list[str]] = {}  # connector id -> registered tool names
        self._defs: dict[str, dict[str, Mapping[str, Any]]] = {}  # connector id -> tool -> definition
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()  # client sessions already drift-checked
        self._offers: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
        self._learning: set[str] = set()
        self._notify_drift = notify_drift

    # -- registration --------------------------------------------------------------------------

    def sync(self) -> list[str]:
        """Register the cached tools of every trusted connector, unregister the rest; return changed ids."""
        changed = []
        trusted = {c.id: c for c in self._manager.trusted()}
        for connector_id in list(self._registered):
            if connector_id not in trusted:
                self._unregister(connector_id)
                changed.append(connector_id)
        for connector_id, connector in trusted.items():
            if connector_id in self._registered:
                if self._specs.get(connector_id) == connector.spec:
                    continue
                # Still trusted (same key), but what it declares for sidecar changed: register it anew.
                self._unregister(connector_id)
            offers = self._cached(connector.key)
            if offers is not None:
                self._offers[connector_id] = offers
                self._register(connector, offers["tools"])
                changed.append(connector_id)
        return changed

    async def learn(self, connector: Connector) -> list[Mapping[str, Any]]:
        """Probe a freshly trusted connector for its tools, cache them, approve their fingerprints."""
        self._learning.add(connector.id)
        try:
            offers = await self._probe(connector.spec)
        finally:
            self._learning.discard(connector.id)
        tools = offers["tools"]
        problems = [
            f"{t['name']}: name too long as {connector_tool(connector.id, t['name'])}"
            for t in tools
            if len(connector_tool(connector.id, str(t["name"]))) > MAX_TOOL_NAME
        ]
        if problems:
            raise ToolError(f"connector {connector.id} refused: " + "; ".join(problems))
        write_json(_cache_file(self._cache_dir, connector.key), {"key": connector.key, **offers})
        self._trust.approve_tools(connector.key, {str(t["name"]): tool_fingerprint(t) for t in tools})
        self._unregister(connector.id)
        self._register(connector, tools)
        self._offers[connector.id] = offers
        return tools

    def _cached(self, key: str) -> dict[str, list[Mapping[str, Any]]] | None:
        try:
            data = read_json(_cache_file(self._cache_dir, key))
        except FileNotFoundError:
            return None
        except StorageError as exc:
            logger.warning("ignoring the tool cache for %s: %s", key, exc)
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("tools"), list):
            return None
        offers: dict[str, list[Mapping[str, Any]]] = {}
        for kind, required in (
            ("tools", "name"),
            ("resources", "uri"),
            ("resourceTemplates", "uriTemplate"),
            ("prompts", "name"),
        ):
            items = data.get(kind, [])
            offers[kind] = [i for i in items if isinstance(i, dict) and isinstance(i.get(required), str)]
        return offers

    def offers(self, connector_id: str) -> Mapping[str, list[Mapping[str, Any]]]:
        """What a trusted connector offers besides tools (cached with them): resources, templates, prompts."""
        return self._offers.get(connector_id, {})

    def _register(self, connector: Connector, tools: list[Mapping[str, Any]]) -> None:
        names = []
        spec = connector.spec
        self._defs[connector.id] = {str(t["name"]): t for t in tools}
        self._specs[connector.id] = spec
        if self._billing is not None:
            # SECURITY: its manifests cover its tools before they are callable (a corrupt one makes them ask).
            self._billing.cover(connector_route(spec.id), billing_sources(spec))
        for tool in tools:
            name = str(tool["name"])
            full = connector_tool(connector.id, name)
            if len(full) > MAX_TOOL_NAME or self._registry.get(full) is not None:
                logger.warning("not registering %s: name too long or taken", full)
                continue
            schema = tool.get("inputSchema") or {"type": "object", "properties": {}}
            if not isinstance(schema, dict) or schema.get("type") != "object":
                schema = {"type": "object", "properties": {}, "additionalProperties": True}
            risk = Risk(spec.tool_risks.get(name, Risk.MEDIUM.value))
            try:
                self._registry.add(
                    name=full,
                    description=str(tool.get("description") or "")[:2000],
                    risk=risk,
                    handler=self._handler(connector.id, name),
                    parameters={**schema, "additionalProperties": True},
                    title=tool.get("title") if isinstance(tool.get("title"), str) else None,
                    needs_network=spec.network,
                    defer_loading=self._deferral.deferred(spec, name),
                    available=self._availability(connector.id, name),
                    source=connector_route(connector.id),
                    server=connector.id,
                )
            except (ValueError, Exception) as exc:  # a schema jsonschema cannot use: skip that tool
                logger.warning("not registering %s: %s", full, exc)
                continue
            names.append(full)
        self._registered[connector.id] = names

    def _unregister(self, connector_id: str) -> None:
        for name in self._registered.pop(connector_id, []):
            self._registry.remove(name)
        self._defs.pop(connector_id, None)
        self._offers.pop(connector_id, None)
        self._specs.pop(connector_id, None)
        if self._billing is not None:
            self._billing.cover(connector_route(connector_id), [])

    def learning(self, connector_id: str) -> bool:
        """Whether the connector's tools are being learned now (a probe just after trust)."""
        return connector_id in self._learning

    def registered(self, connector_id: str) -> list[str]:
        """The pool names of a connector's tools, as registered now (none unless it is trusted)."""
        return list(self._registered.get(connector_id, []))

    def _availability(self, connector_id: str, tool: str) -> Callable[[Any], bool]:
        def available(session: Any) -> bool:
            connector = self._manager.get(connector_id)
            return (
                connector.trusted
                and tool not in connector.tool_drift
                and self._pool.available(session.id, connector_id)
            )

        return available

    # -- calls ---------------------------------------------------------------------------------

    def _handler(self, connector_id: str, tool: str) -> Callable[[dict[str, Any], CallContext], Any]:
        async def call(arguments: dict[str, Any], context: CallContext) -> ToolOutput:
            connector = self._manager.get(connector_id)
            if not connector.trusted:
                raise ToolError(f"connector {connector_id} is not trusted")
            spec = connector.spec
            client = await self._pool.client(
                context.session_id,
                spec,
                lambda: launch_plan(spec, self._context(context.session_id, context.workspace)),
            )
            if client not in self._checked:
                await self._check_drift(connector, client)
            if tool in connector.tool_drift:
                raise ToolError(withheld_message(connector, tool))

            relay = context.progress  # None unless the client asked for progress

            try:
                # Raw: the result is forwarded, so the typed client's models and output-schema check
                # do not pay (connectors/rawcall.py).
                result = await _raw_call(client, tool, arguments, relay, self._pool.lane(client))
            except TimeoutError:
                raise ToolError(f"{tool} took longer than {CALL_TIMEOUT:.0f}s") from None
            except MCPError as exc:
                if exc.error.code == CONNECTION_CLOSED:
                    reason = await self._pool.settle(context.session_id, connector_id)
                    raise ToolError(
                        f"connector {connector_id} stopped unexpectedly ({reason or 'connection closed'}); "
                        "sidecar restarts it on a later call"
                    ) from None
                raise ToolError(f"{connector_id}: {preview(exc.error.message, 300, quote=False)}") from None
            self._pool.healthy(context.session_id, connector_id)
            return tool_result(result)

        return call

    async def vet(self, spec: ConnectorSpec, client: Any) -> None:
        """The drift check of a process started ahead of its session (a warm spare), done now."""
        connector = self._manager.get(spec.id)
        if connector.spec == spec and client not in self._checked:
            await self._check_drift(connector, client)

    async def _check_drift(self, connector: Connector, client: Any) -> None:
        """Rug-pull check, once per process: its tools against the fingerprints approved at trust."""
        self._checked.add(client)
        self.record_drift(connector, await self._list(client))

    def record_drift(self, connector: Connector, tools: list[Mapping[str, Any]]) -> None:
        """Compare tools a connector just listed with those approved at trust; withhold and announce changes."""
        drift = self._trust.tool_drift(connector.key, {str(t["name"]): tool_fingerprint(t) for t in tools})
        if drift != connector.tool_drift:
            connector.tool_drift = drift
            if drift:
                logger.warning("connector %s changed tools since it was trusted: %s", connector.id, drift)
            self._notify_drift()

    @staticmethod
    async def _list(client: Any) -> list[Mapping[str, Any]]:
        tools: list[Mapping[str, Any]] = []
        cursor: str | None = None
        for _ in range(50):  # pages
            page = await client.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def _probe(self, spec: ConnectorSpec) -> dict[str, list[Mapping[str, Any]]]:
        with tempfile.TemporaryDirectory(prefix="sidecar-probe-") as scratch:
            context = LaunchContext(origin="", authorization="", envelope="", workspace=scratch, sandbox=self._sandbox)
            plan: LaunchPlan = launch_plan(spec, context)
            session_id = f"{PROBE_SESSION}:{spec.id}"
            try:
                client = await self._pool.client(session_id, spec, lambda: plan)
                offers: dict[str, list[Mapping[str, Any]]] = {"tools": await self._list(client)}
                for kind, method, field in (
                    ("resources", client.list_resources, "resources"),
                    ("resourceTemplates", client.list_resource_templates, "resource_templates"),
                    ("prompts", client.list_prompts, "prompts"),
                ):
                    try:
                        page = await method()
                    except Exception:  # not offered (METHOD_NOT_FOUND, no capability) or refused: none of that kind
                        offers[kind] = []
                        continue
                    offers[kind] = [
                        item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in getattr(page, field)
                    ]
                return offers
            except MCPError as exc:
                message = preview(exc.error.message, 200, quote=False)
                raise ToolError(f"connector {spec.id} did not list its tools: {message}") from None
            finally:
                await self._pool.stop_session(session_id)
