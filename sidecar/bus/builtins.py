"""Built-in tools: trusted by definition, registered here with their risk (SPEC §5, §6)."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from sidecar.bus.calculator import CalcError, evaluate
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.errors import ToolError

__all__ = ["install_builtins"]


def install_builtins(registry: ToolRegistry) -> ToolRegistry:
    """Register the built-in tools on ``registry`` and return it."""

    @registry.tool(
        name="get_current_time",
        title="Current time",
        description="The current date and time in a time zone (IANA name such as 'Europe/Paris'; default UTC).",
        risk=Risk.LOW,
        parameters={
            "type": "object",
            "properties": {
                "timezone": {"type": "string", "description": "IANA time zone name", "default": "UTC"},
            },
        },
    )
    async def get_current_time(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        name = arguments.get("timezone") or "UTC"
        try:
            zone = zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ToolError(f"unknown time zone {name[:64]!r}") from None
        now = dt.datetime.now(zone)
        return ToolOutput(
            text=now.isoformat(timespec="seconds"),
            structured={"timezone": name, "iso": now.isoformat(timespec="seconds"), "unix": int(now.timestamp())},
        )

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

    return registry
