"""A request straight onto a connector's stdin, its response picked off stdout before the SDK parses it.

A proxied ``tools/call`` through the SDK's client costs, per call, a pydantic request model and its
serialisation, two memory streams and the stdin writer task's turn on the way out, then a pydantic parse
of the response line, a hop through the dispatcher's read loop and a third memory stream on the way
back. A relayed call needs none of it: the request is already a dict the bus has decided, and the result
is only forwarded. ``RawLane`` writes the request as one line itself (a pipe write is one system call,
whole lines never interleave with the SDK writer's) and ``StdioFraming`` hands each stdout line to
``pick`` first: a response to one of the lane's own ids resolves its waiter at once, and every other
line (the SDK's own responses, notifications, the connector's requests to the client) goes on to the
SDK session exactly as before.

The lane's ids are strings (``sidecar-lane-N``) that the SDK's integer ids can never equal; JSON-RPC
and MCP allow either, and a response to an id the lane gave up on (its caller cancelled) is dropped
here, not handed to the SDK. Only requests that need nothing back but their response take the lane: a
call with a progress token, or anything that waits on the client, goes through the SDK session.

Cancelling a waiting ``request`` sends ``notifications/cancelled`` for its id (the MCP spec's courtesy,
as the SDK sends it); EOF on stdout or a broken stdin fails every waiter with ``CONNECTION_CLOSED``, the
SDK's own error for a closed connection, so callers handle both paths alike.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR

__all__ = ["RawLane"]

logger = logging.getLogger(__name__)

_PREFIX: Final = "sidecar-lane-"
_CLOSED: Final = "Connection closed"
"""The SDK's message for ``CONNECTION_CLOSED``."""


class RawLane:
    """One connector's stdin for requests sent raw, and the waiters for their responses."""

    def __init__(self, name: str, stdin: asyncio.StreamWriter) -> None:
        self.name = name
        self._stdin = stdin
        self._ids = itertools.count(1)
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests sent on the lane that have no response yet."""
        return len(self._waiting)

    async def request(self, method: str, params: Mapping[str, Any], *, request_id: str | None = None) -> dict[str, Any]:
        """Send one request and return its result as the connector sent it; ``MCPError`` for its error.

        ``request_id`` must be a string the connection never used (the relay passes its own); by default
        the lane mints one. Raises ``MCPError(CONNECTION_CLOSED)`` once the connector's pipes are gone.
        """
        if self._closed or self._stdin.is_closing():
            raise MCPError(code=CONNECTION_CLOSED, message=_CLOSED)
        ours = request_id if request_id is not None else f"{_PREFIX}{next(self._ids)}"
        try:
            line = _line({"jsonrpc": "2.0", "id": ours, "method": method, "params": params})
        except ValueError as exc:  # not JSON (NaN, a value of no JSON type): the request cannot be sent
            raise MCPError(code=INTERNAL_ERROR, message=f"{method}: arguments are not JSON ({exc})") from None
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ours] = waiter
        try:
            self._stdin.write(line)
            await self._stdin.drain()
            return await waiter
        except OSError:  # BrokenPipe/ConnectionReset: the connector closed stdin or died
            raise MCPError(code=CONNECTION_CLOSED, message=_CLOSED) from None
        except asyncio.CancelledError:
            if waiter.cancelled() or not waiter.done():  # awaiting it cancels it: no response came
                self._cancel(ours)
            raise
        finally:
            self._waiting.pop(ours, None)

    def pick(self, line: bytes) -> bool:
        """Take ``line`` if it answers a request of the lane's (or one it gave up on); False leaves it to the SDK."""
        try:
            message = json.loads(line)
        except ValueError:
            return False  # the SDK's parse logs it, without its text
        if not isinstance(message, dict) or "method" in message:
            return False
        ours = message.get("id")
        if not isinstance(ours, str):
            return False
        waiter = self._waiting.get(ours)
        if waiter is None:
            # Ours, given up on (its caller was cancelled): the SDK has no waiter for it either.
            return ours.startswith(_PREFIX)
        if waiter.done():
            return True
        error = message.get("error")
        result = message.get("result")
        if isinstance(error, dict):
            code, text = error.get("code"), error.get("message")
            waiter.set_exception(
                MCPError(
                    code=code if isinstance(code, int) else INTERNAL_ERROR,
                    message=text if isinstance(text, str) else "the connector sent an error without a message",
                    data=error.get("data"),
                )
            )
        elif isinstance(result, dict):
            waiter.set_result(result)
        else:
            waiter.set_exception(MCPError(code=INTERNAL_ERROR, message="the connector sent a malformed response"))
        return True

    def close(self) -> None:
        """The connection is gone: every waiter fails with ``CONNECTION_CLOSED``, and so do later requests."""
        self._closed = True
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(MCPError(code=CONNECTION_CLOSED, message=_CLOSED))

    def _cancel(self, ours: str) -> None:
        """The courtesy ``notifications/cancelled``; nothing to do if the pipe is already gone."""
        if self._closed or self._stdin.is_closing():
            return
        notice = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": ours, "reason": "caller cancelled"},
        }
        try:
            self._stdin.write(_line(notice))
        except (OSError, RuntimeError):
            logger.debug("connector %s: could not send the cancel of %s", self.name, ours)


def _line(message: Mapping[str, Any]) -> bytes:
    """One JSON-RPC message as one stdio line (JSON escapes every newline inside strings)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"
