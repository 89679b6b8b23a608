"""The daemon's own origin on its MCP endpoints: accepted there (a local page the daemon serves, or the
official conformance suite pointed at it), and still worth nothing without the route token and envelope.
Everywhere else — the control API, the REST facade — it stays refused."""

from __future__ import annotations

from typing import Final

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.helpers import initialize_request, request_json

MCP: Final = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _origins(daemon: Daemon) -> list[str]:
    return [f"http://127.0.0.1:{daemon.port}", f"http://localhost:{daemon.port}", f"http://[::1]:{daemon.port}"]


async def _initialize(daemon: Daemon, headers: dict[str, str], path: str = "/mcp") -> tuple[int, str]:
    """The status and body text of an ``initialize`` (answered as JSON or as a one-event SSE stream)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(daemon.url + path, json=initialize_request("page"), headers={**MCP, **headers}) as response,
    ):
        return response.status, await response.text()


@pytest.mark.parametrize("which", [0, 1, 2], ids=["127.0.0.1", "localhost", "[::1]"])
async def test_an_mcp_client_on_the_daemons_own_origin_is_served(daemon: Daemon, which: int) -> None:
    session = await daemon.new_session()
    status, body = await _initialize(daemon, {**session["headers"], "Origin": _origins(daemon)[which]})
    assert status == 200, body
    assert '"serverInfo"' in body and '"result"' in body


async def test_the_own_origin_without_the_route_token_opens_nothing(daemon: Daemon) -> None:
    session = await daemon.new_session()
    own = {"Origin": _origins(daemon)[0]}
    status, _ = await _initialize(daemon, own)
    assert status == 401
    status, _ = await _initialize(daemon, {**own, "X-Sidecar-Context": session["headers"]["X-Sidecar-Context"]})
    assert status == 401
    status, _ = await _initialize(daemon, {**own, "Authorization": session["headers"]["Authorization"]})
    assert status == 403  # the route token alone: no session
    assert not [r for r in daemon.audit_events() if r["event"] == "tool.call"]


async def test_a_connectors_route_takes_the_own_origin_too_and_a_foreign_one_never(daemon: Daemon) -> None:
    session = await daemon.new_session()
    status, _ = await _initialize(daemon, {**session["headers"], "Origin": _origins(daemon)[0]}, "/mcp/connectors/x")
    assert status != 403  # past the guard: the route is unknown (no such connector), not a refused origin
    for foreign in (f"http://127.0.0.1:{daemon.port + 1}", "http://evil.example", "null"):
        status, _ = await _initialize(daemon, {**session["headers"], "Origin": foreign})
        assert status == 403, foreign


async def test_the_own_origin_stays_refused_on_control_and_rest(daemon: Daemon) -> None:
    own = {"Origin": _origins(daemon)[0]}
    status, _ = await request_json(
        "GET", daemon.url + "/control/status", headers={**own, "Authorization": f"Bearer {daemon.control_token}"}
    )
    assert status == 403
    session = await daemon.new_session()
    status, _ = await request_json("GET", daemon.url + "/api/v1/mcp/tools", headers={**own, **session["headers"]})
    assert status == 403
