"""The tool registry: built-in tools are registered where they are defined, with a fixed risk.

``@registry.tool(name=..., description=..., risk=..., parameters={...})`` on an async function
``(arguments: dict, call: CallContext) -> ToolOutput``. Risk is part of the definition and cannot
change at run time (the definition is frozen).
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from jsonschema import Draft202012Validator

from sidecar.names import TOOL_NAME

if TYPE_CHECKING:
    from sidecar.auth.sessions import Session

__all__ = [
    "CallContext",
    "Risk",
    "ToolBus",
    "ToolDef",
    "ToolHandler",
    "ToolOptions",
    "ToolOutput",
    "ToolRegistry",
    "validate_tool_name",
]


class Risk(enum.StrEnum):
    """contract §6: LOW reads, MEDIUM has reversible side effects, HIGH is irreversible or talks outward."""

    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"


def validate_tool_name(name: str) -> str:
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"invalid tool name {name!r}: 1-64 characters of A-Z a-z 0-9 _ . -")
    return name


Progress = Callable[[float, float | None, str | None], Awaitable[None]]
"""(progress, total, message) → sent to the client if its request carried a progress token."""


class ToolBus(Protocol):
    """The session-bound view of the tool pool that ``tool_search``/``tool_call`` work through."""

    def search(self, query: str, limit: int) -> list[ToolDef]: ...

    async def call(self, name: str, arguments: Mapping[str, Any]) -> Any: ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a tool may know about the call: the session's id, project and workspace, and the pool."""

    session_id: str
    project_id: str
    workspace: str
    bus: ToolBus | None = None
    progress: Progress | None = None
    """Report progress to the caller (MCP ``notifications/progress``), when it asked for it."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool's result: text for the model and, optionally, structured content.

    ``content`` carries MCP content blocks as they came from a connector (images, resources, …) so a
    proxied result reaches the client whole; ``text`` is then its plain-text summary.
    """

    text: str
    structured: Mapping[str, Any] | None = None
    content: tuple[Mapping[str, Any], ...] | None = None
    is_error: bool = False
    """A connector's own error result (kept whole, content included), not a failure of sidecar's."""
    raw: Mapping[str, Any] | None = None
    """The connector's whole result as it came over the wire (the faithful relay passes it on untouched)."""
    meta: Mapping[str, Any] | None = None
    """The result's ``_meta`` from sidecar: a connector result's origin (``bus/untrusted.py``)."""


ToolHandler = Callable[[dict[str, Any], CallContext], Awaitable[ToolOutput]]
"""A tool's implementation; ``ToolService.call(execute=...)`` may stand in for it (the faithful relay)."""


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One tool's definition. ``source``/``server`` say where it comes from (``builtin`` here)."""

    name: str
    description: str
    risk: Risk
    input_schema: Mapping[str, Any]
    handler: ToolHandler
    title: str | None = None
    tags: frozenset[str] = frozenset()
    needs_network: bool = False
    defer_loading: bool = False
    available: Callable[[Session], bool] | None = field(default=None, compare=False)
    """Optional predicate over the session: False hides the tool (e.g. needs a workspace file)."""
    source: str = "builtin"
    server: str = "sidecar"
    validator: Draft202012Validator = field(compare=False, repr=False, default=None)  # type: ignore[assignment]

    @property
    def scope(self) -> str:
        """Which trust and billing scope the tool belongs to: ``builtin`` or ``<source>``."""
        return self.source


class ToolOptions(TypedDict, total=False):
    """What a built-in tool may declare besides its name, description and risk (``ToolRegistry.add``)."""

    parameters: Mapping[str, Any] | None
    title: str | None
    tags: frozenset[str]
    needs_network: bool
    defer_loading: bool
    available: Callable[[Session], bool] | None


def _check_schema(schema: dict[str, Any]) -> None:
    """Raise unless ``schema`` is a valid JSON Schema; a schema already seen is not checked again."""
    try:
        text = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        Draft202012Validator.check_schema(schema)  # not JSON: let the validator say what is wrong
        return
    _check_schema_text(text)


@functools.lru_cache(maxsize=1024)
def _check_schema_text(text: str) -> None:
    # Checking against the meta-schema is most of a daemon's start (the same built-in schemas each
    # time) and of a connector's tool listing; the check is pure, so its answer for one text holds.
    Draft202012Validator.check_schema(json.loads(text))


class ToolRegistry:
    """Holds tool definitions by name; names are unique and never silently replaced."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolDef] = {}
        self.version = 0
        """Bumped on every add and remove, so caches (the search index) know to refresh."""

    def tool(
        self, *, name: str, description: str, risk: Risk, **options: Unpack[ToolOptions]
    ) -> Callable[[ToolHandler], ToolHandler]:
        """Decorator registering an async handler as a tool; ``options`` as ``add`` takes them."""

        def register(handler: ToolHandler) -> ToolHandler:
            self.add(name=name, description=description, risk=risk, handler=handler, **options)
            return handler

        return register

    def add(
        self,
        *,
        name: str,
        description: str,
        risk: Risk,
        handler: ToolHandler,
        parameters: Mapping[str, Any] | None = None,
        title: str | None = None,
        tags: frozenset[str] = frozenset(),
        needs_network: bool = False,
        defer_loading: bool = False,
        available: Callable[[Session], bool] | None = None,
        source: str = "builtin",
        server: str = "sidecar",
    ) -> ToolDef:
        validate_tool_name(name)
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        schema = dict(parameters or {"type": "object", "properties": {}})
        if schema.get("type") != "object":
            raise ValueError(f"tool {name!r}: parameters must be a JSON Schema of type object")
        _check_schema(schema)
        definition = ToolDef(
            name=name,
            description=description,
            risk=Risk(risk),
            input_schema=schema,
            handler=handler,
            title=title,
            tags=tags,
            needs_network=needs_network,
            defer_loading=defer_loading,
            available=available,
            source=source,
            server=server,
            validator=Draft202012Validator(schema),
        )
        self._tools[name] = definition
        self.version += 1
        return definition

    def remove(self, name: str) -> ToolDef | None:
        """Unregister a tool (a connector untrusted or changed); returns what was removed."""
        removed = self._tools.pop(name, None)
        if removed is not None:
            self.version += 1
        return removed

    def get(self, name: str) -> ToolDef | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[ToolDef]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
