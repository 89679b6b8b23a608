"""Connector resources and prompts, proxied under namespaced URIs and names (contract §5).

A connector's resource ``test://static/1`` is offered as ``sidecar:<id>/test://static/1`` and its
prompt ``simple`` as ``mcp__<id>__simple``, so nothing from two connectors can collide and every read
can be routed back. What a connector offers is learned with its tools at trust time and cached with
them; reading and getting go to the session's own process of that connector.

Who sees them: a session whose grant covers the whole connector (``*`` or ``mcp__<id>__*``) and that has
the network unless the connector works offline (``policy.grants_connector``), while it is trusted.
Reading a resource or getting a prompt has no side effects, so every mode may.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final

from mcp import types
from mcp.shared.exceptions import MCPError

from sidecar.auth.sessions import Session
from sidecar.bus.policy import grants_connector
from sidecar.connectors.launch import CALL_TIMEOUT, LaunchContext, launch_plan
from sidecar.connectors.manager import Connector, ConnectorManager
from sidecar.connectors.pool import ConnectorPool
from sidecar.errors import NotFound, ToolError
from sidecar.names import connector_tool, split_connector_tool
from sidecar.text import preview

__all__ = ["ConnectorCatalog", "local_uri", "remote_uri"]

URI_PREFIX: Final = "sidecar:"


def local_uri(connector_id: str, uri: str) -> str:
    return f"{URI_PREFIX}{connector_id}/{uri}"


def remote_uri(uri: str) -> tuple[str, str]:
    """``sidecar:<id>/<original>`` → (id, original); ``NotFound`` for anything else."""
    if not uri.startswith(URI_PREFIX):
        raise NotFound("no such resource")
    connector_id, sep, original = uri[len(URI_PREFIX) :].partition("/")
    if not sep or not connector_id or not original:
        raise NotFound("no such resource")
    return connector_id, original


class ConnectorCatalog:
    """Lists and reads what trusted connectors offer besides tools."""

    def __init__(
        self,
        *,
        manager: ConnectorManager,
        pool: ConnectorPool,
        offers: Callable[[str], Mapping[str, list[Mapping[str, Any]]]],
        context: Callable[[str, str], LaunchContext],
    ) -> None:
        self._manager = manager
        self._pool = pool
        self._offers = offers  # connector id -> {"resources": [...], "resourceTemplates": [...], "prompts": [...]}
        self._context = context

    def _visible(self, session: Session) -> list[Connector]:
        return [c for c in self._manager.trusted() if grants_connector(session, c.id, needs_network=c.spec.network)]

    def resources(self, session: Session) -> list[types.Resource]:
        found = []
        for connector in self._visible(session):
            for raw in self._offers(connector.id).get("resources", []):
                item = dict(raw)
                item["uri"] = local_uri(connector.id, str(raw["uri"]))
                item["name"] = connector_tool(connector.id, str(raw.get("name", "")))
                found.append(types.Resource.model_validate(item))
        return found

    def templates(self, session: Session) -> list[types.ResourceTemplate]:
        found = []
        for connector in self._visible(session):
            for raw in self._offers(connector.id).get("resourceTemplates", []):
                item = dict(raw)
                item["uriTemplate"] = local_uri(connector.id, str(raw["uriTemplate"]))
                item["name"] = connector_tool(connector.id, str(raw.get("name", "")))
                found.append(types.ResourceTemplate.model_validate(item))
        return found

    def prompts(self, session: Session) -> list[types.Prompt]:
        found = []
        for connector in self._visible(session):
            for raw in self._offers(connector.id).get("prompts", []):
                item = dict(raw)
                item["name"] = connector_tool(connector.id, str(raw["name"]))
                found.append(types.Prompt.model_validate(item))
        return found

    def _connector_for(self, session: Session, connector_id: str) -> Connector:
        for connector in self._visible(session):
            if connector.id == connector_id:
                return connector
        raise NotFound("no such resource or prompt")  # SECURITY: not visible and absent look the same

    async def read(self, session: Session, uri: str) -> types.ReadResourceResult:
        connector_id, original = remote_uri(uri)
        client = await self._client(session, self._connector_for(session, connector_id))
        try:
            result = await asyncio.wait_for(client.read_resource(original), CALL_TIMEOUT)
        except MCPError as exc:
            raise ToolError(f"{connector_id}: {preview(exc.error.message, 300, quote=False)}") from None
        contents = []
        for content in result.contents:
            item = content.model_dump(by_alias=True, mode="json", exclude_none=True)
            item["uri"] = local_uri(connector_id, str(item["uri"]))
            contents.append(item)
        return types.ReadResourceResult.model_validate({"contents": contents})

    async def prompt(self, session: Session, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        parts = split_connector_tool(name)
        if parts is None:
            raise NotFound("no such prompt")
        connector_id, original = parts
        client = await self._client(session, self._connector_for(session, connector_id))
        try:
            return await asyncio.wait_for(client.get_prompt(original, arguments), CALL_TIMEOUT)
        except MCPError as exc:
            raise ToolError(f"{connector_id}: {preview(exc.error.message, 300, quote=False)}") from None

    async def _client(self, session: Session, connector: Connector) -> Any:
        spec = connector.spec
        return await self._pool.client(
            session.id, spec, lambda: launch_plan(spec, self._context(session.id, session.workspace))
        )
