"""Built-in tools: trusted by definition, registered here with their risk (contract §5, §6).

| tool | risk | what |
|---|---|---|
| ``get_current_time`` | LOW | the time in an IANA zone |
| ``calculate`` | LOW | arithmetic through an AST whitelist, never ``eval`` |
| ``tool_search`` | LOW | BM25 search over the session's allowed deferred tools, with their schemas |
| ``tool_call`` | LOW | run a tool found by search, through the same decision and gates as a direct call |
| ``notes_read`` | LOW | this project's shared notebook |
| ``note_save`` | MEDIUM | add a dated entry to the notebook (asks in ``default`` mode) |
| ``notes_clear`` | HIGH | erase the notebook — irreversible, so never exposed to agents |
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from pathlib import Path
from typing import Any

from sidecar.bus.calculator import CalcError, evaluate
from sidecar.bus.notes import MAX_NOTE_CHARS, NoteBook
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.errors import ToolError
from sidecar.text import preview

__all__ = ["install_builtins"]


def install_builtins(registry: ToolRegistry, *, notes_dir: Path) -> ToolRegistry:
    """Register the built-in tools on ``registry`` and return it (``list_connectors`` comes with the
    connectors, which register it themselves)."""
    notebook = NoteBook(notes_dir)
    _install_basics(registry)
    _install_meta(registry)
    _install_notes(registry, notebook)
    return registry


def _install_basics(registry: ToolRegistry) -> None:
    @registry.tool(
        name="get_current_time",
        title="Current time",
        description="The current date and time in a time zone (IANA name such as 'Europe/Paris'; default UTC).",
        risk=Risk.LOW,
        parameters={
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA time zone name", "default": "UTC"}},
        },
    )
    async def get_current_time(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        name = arguments.get("timezone") or "UTC"
        try:
            zone = zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {preview(name, 64)}") from None
        now = dt.datetime.now(zone)
        iso = now.isoformat(timespec="seconds")
        return ToolOutput(text=iso, structured={"timezone": name, "iso": iso, "unix": int(now.timestamp())})

    @registry.tool(
        name="calculate",
        title="Calculator",
        description=(
            "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, and "
            "abs round min max sqrt exp log log10 log2 sin cos tan asin acos atan floor ceil factorial, pi e tau."
        ),
        risk=Risk.LOW,
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 1000}},
            "required": ["expression"],
        },
    )
    async def calculate(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        try:
            value = evaluate(arguments["expression"])
        except CalcError as exc:
            raise ToolError(str(exc)) from None
        return ToolOutput(text=str(value), structured={"result": value})


def _install_meta(registry: ToolRegistry) -> None:
    @registry.tool(
        name="tool_search",
        title="Search tools",
        description=(
            "Find tools that are not in the tool list (deferred): ranks the tools this session may use by "
            "name, description and parameters, and returns each one's name, description and input schema. "
            "Run a result with tool_call."
        ),
        risk=Risk.LOW,
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 500},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            },
            "required": ["query"],
        },
    )
    async def tool_search(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        if call.bus is None:
            raise ToolError("tool search is not available here")
        found = call.bus.search(arguments["query"], int(arguments.get("limit", 10)))
        tools = [{"name": t.name, "description": t.description, "inputSchema": dict(t.input_schema)} for t in found]
        text = "\n".join(f"{t.name}: {t.description[:120]}" for t in found) or "no matching tools"
        return ToolOutput(text=text, structured={"tools": tools})

    @registry.tool(
        name="tool_call",
        title="Call a tool",
        description=(
            "Run a tool found with tool_search, by name with its arguments. The same permissions and "
            "approvals apply as to any direct call."
        ),
        risk=Risk.LOW,
        parameters={
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 128},
                "arguments": {"type": "object", "default": {}},
            },
            "required": ["name"],
        },
    )
    async def tool_call(arguments: dict[str, Any], call: CallContext) -> Any:
        if call.bus is None:
            raise ToolError("tool_call is not available here")
        if arguments["name"] in {"tool_call", "tool_search"}:
            raise ToolError("tool_call runs other tools, not itself or tool_search")
        return await call.bus.call(arguments["name"], arguments.get("arguments") or {})


def _install_notes(registry: ToolRegistry, notebook: NoteBook) -> None:
    @registry.tool(
        name="notes_read",
        title="Read project notes",
        description="Read this project's shared notebook: notes agents saved in earlier sessions.",
        risk=Risk.LOW,
    )
    async def notes_read(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        text = notebook.read(call.project_id)
        return ToolOutput(text=text or "no notes yet for this project")

    @registry.tool(
        name="note_save",
        title="Save a project note",
        description="Add a dated note to this project's shared notebook, for later sessions and other agents.",
        risk=Risk.MEDIUM,
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": MAX_NOTE_CHARS}},
            "required": ["text"],
        },
    )
    async def note_save(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        try:
            size = notebook.append(call.project_id, arguments["text"])
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        return ToolOutput(text="saved", structured={"bytes": size})

    @registry.tool(
        name="notes_clear",
        title="Erase project notes",
        description="Erase this project's notebook. Irreversible.",
        risk=Risk.HIGH,
    )
    async def notes_clear(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        notebook.clear(call.project_id)
        return ToolOutput(text="erased")
