"""The REST facade (contract §6): list and invoke the session's tools over plain HTTP, same auth as ``/mcp``.

Its JSON is snake_case and its risks lower-case, as the design's facade has them: a tool is
``{name, description, risk, input_schema, tags, …}`` and a call's answer is ``{source, server, tool,
risk, status, preview, result, structured}`` with ``result`` the tool's text (bounded like every
result, ``bus/bounds.py``) and ``structured`` its structured content or null. ``openapi_document``
describes exactly these shapes and every status a call can end in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp import web

from sidecar import __version__
from sidecar.auth.middleware import PRINCIPAL
from sidecar.auth.routes import route_key
from sidecar.auth.sessions import SessionStore
from sidecar.bus.policy import Verdict
from sidecar.bus.registry import Risk, ToolDef, ToolRegistry
from sidecar.bus.tools import OUTCOME_STATUSES, CallOutcome, ToolService
from sidecar.config import Limits
from sidecar.edge.mcp import tool_control_id
from sidecar.errors import EnvelopeRejected, Forbidden, NotFound, RequestRejected, UnsupportedMediaType
from sidecar.http import json_response
from sidecar.names import TOOL_NAME
from sidecar.net.body import read_json

__all__ = ["RestFacade", "add_rest_routes", "openapi_document"]


def _risk(risk: Risk | None) -> str | None:
    return risk.value.lower() if risk is not None else None


def _tool_json(tool: ToolDef) -> dict[str, Any]:
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "risk": _risk(tool.risk),
        "input_schema": dict(tool.input_schema),
        "tags": sorted(tool.tags),
        "requires_confirmation": tool.risk is Risk.MEDIUM,
        "tool_control_id": tool_control_id(tool),
        "source": tool.source,
        "server": tool.server,
    }


def _outcome_json(outcome: CallOutcome) -> dict[str, Any]:
    structured = outcome.structured
    body: dict[str, Any] = {
        "source": outcome.source,
        "server": outcome.server,
        "tool": outcome.tool,
        "risk": _risk(outcome.risk),
        "status": outcome.status,
        "preview": outcome.preview(),
        "result": outcome.text,
        "structured": dict(structured) if isinstance(structured, Mapping) else structured,
    }
    if outcome.approval_id is not None:
        body["approval_id"] = outcome.approval_id
    return body


def add_rest_routes(app: web.Application, facade: Callable[[web.Request], RestFacade]) -> None:
    """The facade's routes; ``facade`` finds the app's facade for a request (built once the app starts)."""

    async def list_tools(request: web.Request) -> web.Response:
        return await facade(request).list_tools(request)

    async def invoke(request: web.Request) -> web.Response:
        return await facade(request).invoke(request)

    async def openapi(request: web.Request) -> web.Response:
        return await facade(request).openapi(request)

    app.router.add_get("/api/v1/mcp/tools", list_tools)
    app.router.add_post("/api/v1/mcp/tools/{name}/invoke", invoke)
    app.router.add_get("/api/v1/openapi.json", openapi)


class RestFacade:
    def __init__(self, *, registry: ToolRegistry, tools: ToolService, sessions: SessionStore, limits: Limits) -> None:
        self._registry = registry
        self._tools = tools
        self._sessions = sessions
        self._limits = limits

    async def list_tools(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request[PRINCIPAL].session_id)
        return json_response({"tools": [_tool_json(t) for t in self._tools.visible(session)]})

    async def invoke(self, request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        session = self._sessions.alive(principal.session_id)
        if session is None:
            raise EnvelopeRejected("this session has ended")
        name = request.match_info["name"]
        if not TOOL_NAME.fullmatch(name):
            raise NotFound("no such tool")
        tool, decision = self._tools.decide_call(session, name)
        if tool is None or decision.hidden:  # SECURITY: outside its grant or network is as missing (no probing)
            raise NotFound("no such tool")
        if decision.verdict is Verdict.DENY:
            raise Forbidden(f"{name} is not allowed in this session")
        if request.content_type != "application/json":
            raise UnsupportedMediaType("send Content-Type: application/json")
        _, data = await read_json(request, self._limits, empty=b"{}")
        arguments = _invoke_arguments(data)
        outcome = await self._tools.call(session, name, arguments, via="rest", abort_keys=(route_key(principal.route),))
        return json_response(_outcome_json(outcome))

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document())


def _invoke_arguments(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or set(data) - {"arguments"}:
        raise RequestRejected('body must be {"arguments": {...}}')
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise RequestRejected("arguments must be an object")
    return arguments


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 description of the facade (hand-kept; tests validate it and check answers against it)."""

    def error(description: str) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}

    def ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    auth_errors = {
        "401": error("missing or wrong route token"),
        "403": error("bad, expired or ended session envelope, or a tool this session may not use"),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sidecar tool facade",
            "version": __version__,
            "description": "The tools of one sidecar session, with the credentials of its /mcp route.",
        },
        "servers": [{"url": "/"}],
        "security": [{"routeToken": [], "sessionContext": []}],
        "paths": {
            "/api/v1/mcp/tools": {
                "get": {
                    "operationId": "listTools",
                    "summary": "Tools this session may use",
                    "responses": {"200": ok("the tools", _ref("ToolList")), **auth_errors},
                }
            },
            "/api/v1/mcp/tools/{name}/invoke": {
                "post": {
                    "operationId": "invokeTool",
                    "summary": "Call one tool",
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("Invocation")}},
                    },
                    "responses": {
                        "200": ok("how the call ended (a failed or refused call too: see status)", _ref("Outcome")),
                        "400": error('the body is not {"arguments": {...}}, or not strict JSON'),
                        **auth_errors,
                        "404": error("no such tool"),
                        "408": error("the body took too long to arrive"),
                        "413": error("the body is too large"),
                        "415": error("the body is not application/json"),
                    },
                }
            },
            "/api/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {"200": ok("OpenAPI 3.1", {"type": "object"}), **auth_errors},
                }
            },
        },
        "components": {
            "securitySchemes": {
                "routeToken": {"type": "http", "scheme": "bearer"},
                "sessionContext": {"type": "apiKey", "in": "header", "name": "X-Sidecar-Context"},
            },
            "schemas": _SCHEMAS,
        },
    }


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_RISK: Final[dict[str, Any]] = {
    "enum": [r.value.lower() for r in Risk if r is not Risk.HIGH],
    "description": "low: reads; medium: side effects that can be undone (HIGH tools are never exposed)",
}
_SCHEMAS: Final[dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "Tool": {
        "type": "object",
        "required": ["name", "description", "risk", "input_schema", "tags"],
        "properties": {
            "name": {"type": "string"},
            "title": {"type": ["string", "null"]},
            "description": {"type": "string"},
            "risk": _RISK,
            "input_schema": {"type": "object", "description": "JSON Schema of the tool's arguments"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "requires_confirmation": {"type": "boolean", "description": "a call asks first in default mode"},
            "tool_control_id": {"type": "string", "description": "stable id for host interfaces"},
            "source": {"type": "string", "description": "builtin or connector:<id>"},
            "server": {"type": "string"},
        },
    },
    "ToolList": {
        "type": "object",
        "required": ["tools"],
        "properties": {"tools": {"type": "array", "items": _ref("Tool")}},
    },
    "Invocation": {
        "type": "object",
        "properties": {"arguments": {"type": "object"}},
        "additionalProperties": False,
    },
    "Outcome": {
        "type": "object",
        "required": ["source", "server", "tool", "risk", "status", "preview", "result", "structured"],
        "properties": {
            "source": {"type": "string"},
            "server": {"type": "string"},
            "tool": {"type": "string"},
            "risk": {**_RISK, "enum": [*_RISK["enum"], None]},
            "status": {
                "enum": list(OUTCOME_STATUSES),
                "description": (
                    "ok: the tool ran; error: it failed or its arguments were wrong; denied: not allowed "
                    "(decided again when it ran); approval_required: the user must allow it first "
                    "(sidecar approvals allow <approval_id>), then call again with the same arguments; "
                    "declined: the user said no; aborted: the session or route was revoked, or it ended"
                ),
            },
            "preview": {"type": "string", "description": "the result's first line, at most 200 characters"},
            "result": {"type": "string", "description": "the tool's text (cut at [tools] max_result_chars)"},
            "structured": {"description": "the tool's structured content, or null"},
            "approval_id": {"type": "string", "description": "with approval_required: the approval to grant"},
        },
    },
}
