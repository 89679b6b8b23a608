"""Deferred tools: which of a session's tools stay out of ``tools/list``, found with ``tool_search``.

A deferred tool is still the session's to call (through ``tool_call``); deferral only keeps a large
pool out of the agent's context window until it asks for something.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sidecar.bus.registry import ToolDef

__all__ = ["META_TOOLS", "DeferPolicy"]

META_TOOLS: Final = frozenset({"tool_search", "tool_call", "list_connectors"})
"""Built-ins that are never deferred: they are how deferred tools are reached."""
_SEARCH_TOOLS: Final = frozenset({"tool_search", "tool_call"})
"""Without both, a session cannot reach a deferred tool, so nothing is deferred for it."""


@dataclass(frozen=True, slots=True)
class DeferPolicy:
    """Which tools stay out of ``tools/list`` (found with ``tool_search`` instead)."""

    tools: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset()
    auto_above: int = 64
    """When a session may see more tools than this, every tool but the meta-tools is deferred."""

    def deferred(self, tool: ToolDef, pool_size: int) -> bool:
        if tool.name in META_TOOLS and tool.source == "builtin":
            return False
        return (
            tool.defer_loading or tool.name in self.tools or tool.source in self.sources or pool_size > self.auto_above
        )

    def split(self, pool: Sequence[ToolDef]) -> tuple[list[ToolDef], list[ToolDef]]:
        """(listed, deferred) of a session's whole pool. A pool without both ``tool_search`` and
        ``tool_call`` defers nothing: the session could reach none of it (``--allow mcp__<id>__*`` alone
        lists that connector)."""
        meta = {t.name for t in pool if t.source == "builtin" and t.name in _SEARCH_TOOLS}
        if meta != _SEARCH_TOOLS:
            return list(pool), []
        listed: list[ToolDef] = []
        deferred: list[ToolDef] = []
        for tool in pool:
            (deferred if self.deferred(tool, len(pool)) else listed).append(tool)
        return listed, deferred
