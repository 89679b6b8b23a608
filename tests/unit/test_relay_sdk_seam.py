"""The relay's one reach into SDK internals, pinned: if the SDK moves these, this fails first."""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.connection import Connection
from mcp.server.session import ServerSession

from sidecar.edge.relay import _channels, _connection_state


class _Outbound:
    async def send_raw_request(self, method: str, params: Any, opts: Any = None) -> dict[str, Any]:
        return {}

    async def notify(self, method: str, params: Any, opts: Any = None) -> None:
        return None


def test_the_relay_reaches_the_raw_request_channel_and_the_connection() -> None:
    request_channel, standalone = _Outbound(), _Outbound()
    connection = Connection(standalone, protocol_version="2025-11-25", session_id="abc")
    session = ServerSession(request_channel, connection)  # type: ignore[arg-type]
    ctx: ServerRequestContext[Any, Any] = ServerRequestContext(
        session=session, lifespan_context={}, protocol_version="2025-11-25", method="tools/list", request_id=1
    )
    channel, found = _channels(ctx)
    assert channel is request_channel
    assert found is connection and found.outbound is standalone
    _connection_state(ctx)["k"] = 1
    assert connection.state == {"k": 1}  # per-connection state the relay keeps its upstream in
