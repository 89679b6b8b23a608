"""The REST facade (contract §6): list and invoke the session's tools over plain HTTP, same auth as ``/mcp``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from sidecar import __version__
from sidecar.auth.middleware import PRINCIPAL
from sidecar.auth.routes import route_key
from sidecar.auth.sessions import SessionStore
from sidecar.bus.policy import Verdict
from sidecar.bus.registry import ToolDef, ToolRegistry
from sidecar.bus.tools import ToolService
from sidecar.config import Limits
from sidecar.edge.mcp import tool_control_id
from sidecar.errors import EnvelopeRejected, Forbidden, NotFound, RequestRejected, UnsupportedMediaType
from sidecar.http import json_response
from sidecar.names import TOOL_NAME
from sidecar.net.body import read_json

__all__ = ["RestFacade", "add_rest_routes", "openapi_document"]


def _tool_json(tool: ToolDef) -> dict[str, Any]:
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "risk": tool.risk.value,
        "requiresConfirmation": tool.risk.value == "MEDIUM",
        "toolControlId": tool_control_id(tool),
        "source": tool.source,
        "server": tool.server,
    }


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
        return json_response(outcome.as_json())

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
    """OpenAPI 3.1 description of the facade (hand-kept; a test checks it names every route)."""
    error = {"$ref": "#/components/schemas/Error"}
    auth_errors = {
        "401": {"description": "missing or wrong route token", "content": {"application/json": {"schema": error}}},
        "403": {"description": "bad envelope, or tool not allowed", "content": {"application/json": {"schema": error}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "sidecar tool facade", "version": __version__},
        "servers": [{"url": "/"}],
        "security": [{"routeToken": [], "sessionContext": []}],
        "paths": {
            "/api/v1/mcp/tools": {
                "get": {
                    "summary": "Tools this session may use",
                    "responses": {
                        "200": {
                            "description": "the tools",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "tools": {"type": "array", "items": {"$ref": "#/components/schemas/Tool"}}
                                        },
                                    }
                                }
                            },
                        },
                        **auth_errors,
                    },
                }
            },
            "/api/v1/mcp/tools/{name}/invoke": {
                "post": {
                    "summary": "Call one tool",
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"arguments": {"type": "object"}},
                                    "additionalProperties": False,
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "the call's outcome (tool errors have status error)",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Outcome"}}},
                        },
                        "404": {"description": "no such tool", "content": {"application/json": {"schema": error}}},
                        **auth_errors,
                    },
                }
            },
            "/api/v1/openapi.json": {
                "get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}
            },
        },
        "components": {
            "securitySchemes": {
                "routeToken": {"type": "http", "scheme": "bearer"},
                "sessionContext": {"type": "apiKey", "in": "header", "name": "X-Sidecar-Context"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        }
                    },
                },
                "Tool": {
                    "type": "object",
                    "required": ["name", "inputSchema", "risk"],
                    "properties": {
                        "name": {"type": "string"},
                        "title": {"type": ["string", "null"]},
                        "description": {"type": "string"},
                        "inputSchema": {"type": "object"},
                        "risk": {"enum": ["LOW", "MEDIUM"]},
                        "requiresConfirmation": {"type": "boolean"},
                        "toolControlId": {"type": "string"},
                        "source": {"type": "string"},
                        "server": {"type": "string"},
                    },
                },
                "Outcome": {
                    "type": "object",
                    "required": ["source", "server", "tool", "status", "preview"],
                    "properties": {
                        "source": {"type": "string"},
                        "server": {"type": "string"},
                        "tool": {"type": "string"},
                        "status": {"enum": ["ok", "error", "denied", "aborted"]},
                        "preview": {"type": "string"},
                        "result": {"type": "object"},
                    },
                },
            },
        },
    }
