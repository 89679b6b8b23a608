"""A request straight onto a connector's stdin, its response picked off stdout before the SDK parses it.

A proxied ``tools/call`` through the SDK's client costs, per call, a pydantic request model and its
serialisation, two memory streams and the stdin writer task's turn on the way out, then a pydantic parse
of the response line, a hop through the dispatcher's read loop and a third memory stream on the way
back. A relayed call needs none of it: the request is already a dict the bus has decided, and the result
is only forwarded. ``RawLane`` writes the request as one line itself (a pipe write is one system call,
whole lines never interleave with the SDK writer's) and ``StdioFraming`` hands each stdout line to
``claim`` first: a response to one of the lane's own ids resolves its waiter at once, and every other
line (the SDK's own responses, notifications, the connector's requests to the client) goes on to the
SDK session exactly as before.

The lane's ids are strings (``sidecar-lane-N``) that the SDK's integer ids can never equal; JSON-RPC
and MCP allow either, and a response to an id the lane gave up on (its caller cancelled) is dropped
here, not handed to the SDK. A request that wants progress gets its id as its progress token (as the
SDK's dispatcher does), and the connector's ``notifications/progress`` for it are taken here too and
handed to its callback in a ``ProgressChain``: one after the other, and the request returns (or raises)
only once the last was relayed, so no progress can follow the response on the client's stream.

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

from sidecar.bus.registry import Progress
from sidecar.connectors.progress import ProgressChain

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
        self._progress: dict[str, ProgressChain] = {}
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests sent on the lane that have no response yet."""
        return len(self._waiting)

    async def request(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        request_id: str | None = None,
        on_progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Send one request and return its result as the connector sent it; ``MCPError`` for its error.

        ``request_id`` must be a string the connection never used (the relay passes its own); by default
        the lane mints one. With ``on_progress`` the request carries its id as its progress token (any
        token already in its ``_meta`` is replaced) and its progress reaches the callback. Raises
        ``MCPError(CONNECTION_CLOSED)`` once the connector's pipes are gone.
        """
        if self._closed or self._stdin.is_closing():
            raise MCPError(code=CONNECTION_CLOSED, message=_CLOSED)
        ours = request_id if request_id is not None else f"{_PREFIX}{next(self._ids)}"
        if on_progress is not None:
            meta = params.get("_meta")
            params = {**params, "_meta": {**(meta if isinstance(meta, Mapping) else {}), "progressToken": ours}}
        try:
            line = _line({"jsonrpc": "2.0", "id": ours, "method": method, "params": params})
        except ValueError as exc:  # not JSON (NaN, a value of no JSON type): the request cannot be sent
            raise MCPError(code=INTERNAL_ERROR, message=f"{method}: arguments are not JSON ({exc})") from None
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ours] = waiter
        chain = ProgressChain(on_progress) if on_progress is not None else None
        if chain is not None:
            self._progress[ours] = chain
        try:
            self._stdin.write(line)
            await self._stdin.drain()
            return await (waiter if chain is None else chain.answer(waiter))
        except OSError:  # BrokenPipe/ConnectionReset: the connector closed stdin or died
            raise MCPError(code=CONNECTION_CLOSED, message=_CLOSED) from None
        except asyncio.CancelledError:
            if waiter.cancelled() or not waiter.done():  # awaiting it cancels it: no response came
                self._cancel(ours)
            raise
        finally:
            self._waiting.pop(ours, None)
            self._progress.pop(ours, None)

    def claim(self, line: bytes) -> dict[str, Any] | None:
        """The message on ``line`` if it is the lane's: a response to one of its ids (or one it gave up on),
        or progress for one of its requests; None leaves the line to the SDK session."""
        try:
            message = json.loads(line)
        except ValueError:
            return None  # the SDK's parse logs it, without its text
        if not isinstance(message, dict):
            return None
        if "method" in message:
            if message["method"] != "notifications/progress":
                return None
            params = message.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            return message if isinstance(token, str) and token in self._progress else None
        ours = message.get("id")
        if not isinstance(ours, str):
            return None
        # Ours even when given up on (its caller was cancelled): the SDK has no waiter for it either.
        return message if ours in self._waiting or ours.startswith(_PREFIX) else None

    def take(self, message: dict[str, Any]) -> None:
        """Act on a message ``claim`` returned: resolve its waiter, or hand its progress to the callback."""
        if "method" in message:
            self._relay_progress(message.get("params"))
            return
        waiter = self._waiting.get(str(message.get("id")))
        if waiter is None or waiter.done():
            return
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

    def _relay_progress(self, params: object) -> None:
        """Hand a progress notification for one of the lane's requests to its chain."""
        if not isinstance(params, dict):  # claim() saw a dict; kept for the type checker
            return
        chain = self._progress.get(str(params.get("progressToken")))
        if chain is None:
            return  # its request has just ended
        progress, total, text = params.get("progress"), params.get("total"), params.get("message")
        if not isinstance(progress, int | float) or isinstance(progress, bool):
            return  # malformed: dropped, as the SDK drops it
        chain.spawn(
            float(progress),
            float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
            text if isinstance(text, str) else None,
        )

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
