"""The REST facade: same auth as /mcp, same decision, the design's shapes, a valid OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

from sidecar.bus.tools import OUTCOME_STATUSES
from tests.conftest import Daemon
from tests.helpers import rest

INVOKE_KEYS = {"source", "server", "tool", "risk", "status", "preview", "result", "structured"}


async def _openapi(daemon: Daemon, headers: dict[str, str]) -> dict[str, Any]:
    status, doc = await rest(daemon, "GET", "/api/v1/openapi.json", headers)
    assert status == 200
    return doc  # type: ignore[no-any-return]


def _conforms(doc: dict[str, Any], schema: str, body: Any) -> None:
    """``body`` is what the OpenAPI document's ``schema`` describes (3.1 schemas are JSON Schema 2020-12)."""
    Draft202012Validator({"$ref": f"#/components/schemas/{schema}", "components": doc["components"]}).validate(body)


async def test_lists_the_sessions_tools_in_the_designs_shape(daemon: Daemon) -> None:
    session = await daemon.new_session(allow=["calculate", "note_save"])
    status, body = await rest(daemon, "GET", "/api/v1/mcp/tools", session["headers"])
    assert status == 200
    tools = {t["name"]: t for t in body["tools"]}
    assert set(tools) == {"calculate", "note_save"}
    calculate = tools["calculate"]
    assert {"name", "description", "risk", "input_schema", "tags"} <= set(calculate)
    assert calculate["risk"] == "low" and tools["note_save"]["risk"] == "medium"
    assert calculate["input_schema"]["properties"]["expression"]["type"] == "string"
    assert isinstance(calculate["tags"], list)
    assert calculate["tool_control_id"].startswith("tc_") and tools["note_save"]["requires_confirmation"] is True
    _conforms(await _openapi(daemon, session["headers"]), "ToolList", body)


async def test_invoke_returns_the_designs_outcome_and_is_audited(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], {"arguments": {"expression": "6*7"}}
    )
    assert status == 200
    assert body == {
        "source": "builtin",
        "server": "sidecar",
        "tool": "calculate",
        "risk": "low",
        "status": "ok",
        "preview": "42",
        "result": "42",
        "structured": {"result": 42},
    }
    _conforms(await _openapi(daemon, session["headers"]), "Outcome", body)
    [record] = daemon.audit_events("tool.call")
    assert (record["via"], record["outcome"]) == ("rest", "ok")


async def test_tool_failure_is_a_200_with_error_status(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], {"arguments": {"expression": "1/0"}}
    )
    assert status == 200 and set(body) == INVOKE_KEYS
    assert (body["status"], body["risk"], body["result"], body["structured"]) == (
        "error",
        "low",
        "division by zero",
        None,
    )
    assert body["preview"] == "division by zero"
    _conforms(await _openapi(daemon, session["headers"]), "Outcome", body)


async def test_a_call_that_needs_approval_names_the_approval(daemon: Daemon) -> None:
    session = await daemon.new_session(mode="default")
    status, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/note_save/invoke", session["headers"], {"arguments": {"text": "hi"}}
    )
    assert status == 200 and set(body) == INVOKE_KEYS | {"approval_id"}
    assert (body["status"], body["risk"]) == ("approval_required", "medium")
    assert body["approval_id"] in body["result"]
    _conforms(await _openapi(daemon, session["headers"]), "Outcome", body)


async def test_unknown_tool_is_404_and_forbidden_tool_is_403_and_nothing_runs(daemon: Daemon) -> None:
    session = await daemon.new_session(allow=["get_current_time", "note_save"], mode="read-only")
    before = daemon.audit_bytes()
    unknown, _ = await rest(daemon, "POST", "/api/v1/mcp/tools/nope/invoke", session["headers"], {"arguments": {}})
    # Outside the session's grant: as unknown as a missing tool, so names cannot be probed (issue 10, item 4).
    ungranted, _ = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], {"arguments": {"expression": "1"}}
    )
    # Granted, but its mode does not let it run (MEDIUM in read-only): forbidden.
    forbidden, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/note_save/invoke", session["headers"], {"arguments": {"text": "x"}}
    )
    assert (unknown, ungranted, forbidden) == (404, 404, 403)
    assert body["error"]["code"] == "forbidden"
    assert daemon.audit_bytes() == before


async def test_bad_invoke_bodies_are_400(daemon: Daemon) -> None:
    session = await daemon.new_session()
    for bad in ({"arguments": [1]}, {"args": {}}, [1]):
        status, body = await rest(daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], bad)
        assert status == 400, bad
        assert body["error"]["code"] == "bad_request"
    assert daemon.audit_events("tool.call") == []


async def test_rest_needs_the_route_token_and_envelope(daemon: Daemon) -> None:
    session = await daemon.new_session()
    no_token = {"X-Sidecar-Context": session["headers"]["X-Sidecar-Context"]}
    no_envelope = {"Authorization": session["headers"]["Authorization"]}
    assert (await rest(daemon, "GET", "/api/v1/mcp/tools", no_token))[0] == 401
    assert (await rest(daemon, "GET", "/api/v1/mcp/tools", no_envelope))[0] == 403
    assert (await rest(daemon, "GET", "/api/v1/openapi.json", no_token))[0] == 401


async def test_openapi_document_is_valid_and_describes_every_route_and_status(daemon: Daemon) -> None:
    session = await daemon.new_session()
    doc = await _openapi(daemon, session["headers"])
    validate_openapi(doc)  # raises OpenAPIValidationError on an invalid document
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {"/api/v1/mcp/tools", "/api/v1/mcp/tools/{name}/invoke", "/api/v1/openapi.json"}
    outcome = doc["components"]["schemas"]["Outcome"]
    statuses = outcome["properties"]["status"]["enum"]
    assert statuses == list(OUTCOME_STATUSES)
    assert set(statuses) == {"ok", "error", "denied", "approval_required", "declined", "aborted"}
    assert set(outcome["required"]) == INVOKE_KEYS


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        ({"args": {}}, {}, 400),
        ({"arguments": {}}, {"Authorization": "Bearer wrong"}, 401),
        ({"arguments": {}}, {"X-Sidecar-Context": "v1.bad"}, 403),
    ],
)
async def test_invoke_errors_are_the_documented_statuses_and_shape(
    daemon: Daemon, body: Any, headers: dict[str, str], status: int
) -> None:
    session = await daemon.new_session()
    got, answer = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", {**session["headers"], **headers}, body
    )
    assert got == status
    doc = await _openapi(daemon, session["headers"])
    assert str(status) in doc["paths"]["/api/v1/mcp/tools/{name}/invoke"]["post"]["responses"]
    _conforms(doc, "Error", answer)
