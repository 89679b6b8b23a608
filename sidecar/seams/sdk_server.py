"""What the relay needs of the SDK's ``ServerSession``: the exchange's raw channel and its connection.

``ServerSession`` keeps both (``_request_outbound``, ``_connection``) without a public accessor (the
SDK marks its context rework provisional); a relay passes requests through raw, so it needs them.
"""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.connection import Connection

__all__ = ["request_channels"]


def request_channels(ctx: ServerRequestContext[Any, Any]) -> tuple[Any, Connection]:
    """The exchange's raw request-scoped channel and the MCP connection behind ``ctx.session``."""
    session = ctx.session
    return session._request_outbound, session._connection
