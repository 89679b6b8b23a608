"""One JSON body instead of an SSE stream, unless something must reach the client before the result.

The SDK's Streamable HTTP transport answers every 2025-era POST of a stateful session with an SSE
stream, so that progress, log lines and server→client requests (elicitation, sampling) can reach the
client before the result. Most requests send nothing of that, and then the stream is pure cost:
``sse_starlette`` runs five tasks per response. The spec lets the server choose either form for each
POST (the client must accept both), so a request the endpoint marks (``JSON_ANSWER`` in the ASGI scope,
holding the message it already parsed) is answered *lazily* here: it is dispatched as the SDK would
dispatch it (its channel may send requests), and the first message addressed to it decides. The
response itself → one ``application/json`` body; anything else (a progress notification, a log line,
an elicitation) → the SDK's own SSE stream after all, that message first and everything after it in
order, exactly as if the stream had been opened at once. Nothing is dropped and nothing reordered.

The endpoint marks every 2025-era request of a stateful session on ``/mcp`` and on the connectors'
own routes. A 2026-07-28 request is marked only when it will stream nothing (``quiet_call``: a
``tools/call`` on ``/mcp`` without a progress token, of a tool the one decision lets run without
asking), and goes to the SDK's own single-exchange handler in its JSON mode (unmarked ones get its
default: JSON once the handler has finished without emitting, found out with two tasks, a stream and a
timer per request). Should such a call's decision change to *ask* while it is in flight, its channel
cannot send requests (as in the SDK's own JSON mode) and the call falls back to a pending approval, as
for any client that cannot be asked.

Everything before the dispatch is the SDK's: the DNS-rebinding middleware, the terminated-session
404, the Accept and session/protocol-version header checks. The transport's streams and helpers have no
public accessor (``mcp`` 2.3): the mechanism lives in ``sidecar.seams.sdk_streamable``; this module
decides which calls are quiet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sidecar.auth.principal import Principal
from sidecar.auth.sessions import SessionStore
from sidecar.bus.policy import Verdict
from sidecar.bus.tools import ToolService
from sidecar.names import PROXY_ROUTE

__all__ = ["QuietCall", "quiet_call"]

QuietCall = Callable[[Principal, Any], bool]
"""Whether a parsed request of a caller is answered in JSON (``quiet_call``)."""


def quiet_call(tools: ToolService, sessions: SessionStore) -> QuietCall:
    """The requests on ``/mcp`` that will stream nothing: a ``tools/call`` without a progress token, of a
    tool the caller's live session may run without being asked. ``tool_call`` is never one (the call it
    makes may ask)."""

    def quiet(principal: Principal, message: Any) -> bool:
        if principal.route != PROXY_ROUTE or not isinstance(message, Mapping) or "id" not in message:
            return False
        params = message.get("params")
        if message.get("method") != "tools/call" or not isinstance(params, Mapping):
            return False
        name, meta = params.get("name"), params.get("_meta")
        if not isinstance(name, str) or name == "tool_call":
            return False
        if isinstance(meta, Mapping) and meta.get("progressToken") is not None:
            return False
        session = sessions.alive(principal.session_id)
        if session is None:
            return False
        tool, decision = tools.decide_call(session, name)
        return tool is not None and decision.verdict is Verdict.ALLOW

    return quiet
