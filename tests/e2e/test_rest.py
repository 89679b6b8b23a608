"""The REST facade: same auth as /mcp, same decision, normalized results, an OpenAPI document."""

from __future__ import annotations

from tests.conftest import Daemon
from tests.helpers import rest


async def test_lists_the_sessions_tools(daemon: Daemon) -> None:
    session = await daemon.new_session(allow=["calculate"])
    status, body = await rest(daemon, "GET", "/api/v1/mcp/tools", session["headers"])
    assert status == 200
    assert [t["name"] for t in body["tools"]] == ["calculate"]
    assert body["tools"][0]["risk"] == "LOW" and body["tools"][0]["toolControlId"].startswith("tc_")


async def test_invoke_returns_the_normalized_outcome_and_is_audited(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], {"arguments": {"expression": "6*7"}}
    )
    assert status == 200
    assert {k: body[k] for k in ("source", "server", "tool", "status", "preview")} == {
        "source": "builtin",
        "server": "sidecar",
        "tool": "calculate",
        "status": "ok",
        "preview": "42",
    }
    assert body["result"]["structured"] == {"result": 42}
    [record] = daemon.audit_events("tool.call")
    assert (record["via"], record["outcome"]) == ("rest", "ok")


async def test_tool_failure_is_a_200_with_error_status(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, body = await rest(
        daemon, "POST", "/api/v1/mcp/tools/calculate/invoke", session["headers"], {"arguments": {"expression": "1/0"}}
    )
    assert status == 200 and body["status"] == "error" and body["result"]["isError"] is True
    assert body["preview"] == "division by zero"


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


async def test_openapi_document_describes_every_facade_route(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, doc = await rest(daemon, "GET", "/api/v1/openapi.json", session["headers"])
    assert status == 200 and doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {"/api/v1/mcp/tools", "/api/v1/mcp/tools/{name}/invoke", "/api/v1/openapi.json"}
