"""Step-up without an inline sign-in: the refused call's error, the scope the next sign-in asks for, the cap."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from sidecar.oauth.flow import client_metadata
from sidecar.oauth.stepup import MAX_SIGN_INS, NEEDS_SIGN_IN, StepUp, answer_with_error, scope_challenge


def _response(status: int, challenge: str | None) -> httpx2.Response:
    headers = {"www-authenticate": challenge} if challenge else {}
    return httpx2.Response(status, headers=headers, content=b"refused")


@pytest.mark.parametrize(
    ("status", "challenge", "expected"),
    [
        (403, 'Bearer error="insufficient_scope", scope="mcp admin"', "mcp admin"),
        (403, "Bearer error=insufficient_scope, scope=admin", "admin"),
        (403, 'Bearer error="insufficient_scope"', ""),
        (403, 'Bearer error="invalid_token"', None),
        (403, None, None),
        (401, 'Bearer error="insufficient_scope", scope="admin"', None),
    ],
)
def test_only_a_403_insufficient_scope_challenge_is_a_step_up(
    status: int, challenge: str | None, expected: str | None
) -> None:
    assert scope_challenge(_response(status, challenge)) == expected


async def test_the_refusal_becomes_a_json_rpc_error_the_sdk_client_reads() -> None:
    async def unread_body() -> AsyncIterator[bytes]:  # as from the network: not read before the auth sees it
        yield b"refused"

    async def server(request: httpx2.Request) -> httpx2.Response:
        challenge = {"www-authenticate": 'Bearer error="insufficient_scope", scope="admin"'}
        return httpx2.Response(403, headers=challenge, content=unread_body())

    async with (
        httpx2.AsyncClient(transport=httpx2.MockTransport(server)) as http,
        http.stream("POST", "http://127.0.0.1:1/mcp", json={}) as response,
    ):
        await answer_with_error(response, "needs scope 'admin'")
        body = json.loads(await response.aread())
    assert response.status_code == 403 and response.headers["content-type"] == "application/json"
    assert body == {"jsonrpc": "2.0", "id": None, "error": {"code": NEEDS_SIGN_IN, "message": "needs scope 'admin'"}}


def test_the_next_sign_in_asks_for_the_union_and_the_reason_clears_once_granted() -> None:
    step = StepUp("remote")
    assert step.reason() is None
    assert step.scope_for_sign_in("mcp", None) is None  # nothing refused: the server's challenge decides
    hint = step.refused("admin", "mcp offline_access")
    assert hint == "connector remote needs scope 'admin' for this call: run sidecar connectors connect remote"
    step.refused("files:write", "mcp offline_access")
    assert step.reason() is not None and "files:write" in step.reason()  # type: ignore[operator]
    asked = step.scope_for_sign_in("mcp offline_access", "configured")
    assert asked is not None and asked.split() == ["configured", "mcp", "offline_access", "admin", "files:write"]
    step.signed_in("mcp offline_access admin")
    assert step.reason() is not None  # files:write was not granted
    step.signed_in("mcp offline_access admin files:write")
    assert step.reason() is None


def test_a_scope_still_refused_after_three_sign_ins_stops_suggesting_one() -> None:
    step = StepUp("remote")
    for _ in range(MAX_SIGN_INS):
        assert "run sidecar connectors connect remote" in step.refused("admin", "mcp")
        step.scope_for_sign_in("mcp admin", None)
        step.signed_in("mcp admin")
    final = step.refused("admin", "mcp admin")
    assert "will not help" in final and "connect remote" not in final


def test_client_metadata_keeps_the_extra_scope_whatever_the_sdk_assigns() -> None:
    metadata = client_metadata("http://127.0.0.1:1/oauth/callback", extra_scope="mcp admin")
    assert metadata.scope == "mcp admin"
    metadata.scope = "mcp offline_access"  # what the SDK does with the server's challenge
    assert metadata.scope == "mcp offline_access admin"
    assert json.loads(metadata.model_dump_json(exclude_none=True))["scope"] == "mcp offline_access admin"
    plain = client_metadata("http://127.0.0.1:1/oauth/callback")
    plain.scope = "mcp"
    assert plain.scope == "mcp"
