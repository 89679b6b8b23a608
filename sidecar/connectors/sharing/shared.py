"""One session's view of a shared connector process (``"process": "shared"``, contract §7).

A shared process has one MCP client session (``ClientSession``) that every sidecar session's calls go
through. The SDK's client mints a request id for each call and hands each response, and each progress
notification (by its progress token), only to the call that is waiting for it: sessions never see each
other's responses or notifications, and nothing a connector sends on its own reaches any session (the
pool's path forwards only results). ``SessionView`` is what one session holds: the same client, with
each of its requests run as a task of its own and recorded, so that ending that session (revocation,
``DELETE``, expiry) cancels exactly its requests; the SDK then sends the connector
``notifications/cancelled`` for each, and the process serves the other sessions on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sidecar.errors import ToolError

__all__ = ["SessionView"]


class SessionView:
    """``client``'s async methods for one session, every call of them abortable by ``abort()``.

    It hashes and compares as its client does: the connector's tools are checked for drift once per
    process (``ConnectorTools``), and every session's view of a process is that process.
    """

    __slots__ = ("__weakref__", "_aborted", "_calls", "client", "session_id")

    def __init__(self, session_id: str, client: Any) -> None:
        self.session_id = session_id
        self.client = client
        self._calls: set[asyncio.Task[Any]] = set()
        self._aborted = False

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self.client, name)
        if not callable(method):
            raise AttributeError(name)

        async def tracked(*args: Any, **kwargs: Any) -> Any:
            return await self._run(method(*args, **kwargs))

        return tracked

    def __hash__(self) -> int:
        return hash(self.client)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionView):
            return other.client is self.client
        return other is self.client

    @property
    def pending(self) -> int:
        """This session's requests in flight now."""
        return len(self._calls)

    async def track(self, request: Awaitable[Any]) -> Any:
        """Await a request made on ``client`` directly (not through this view's methods) as this
        session's: counted, and aborted with the session."""
        return await self._run(request)

    async def _run(self, request: Awaitable[Any]) -> Any:
        if self._aborted:
            if asyncio.iscoroutine(request):
                request.close()
            raise ToolError("this session has ended")
        task = asyncio.ensure_future(request)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and not _cancelling():
                # abort() cancelled the request, not our caller: say so instead of cancelling the caller.
                raise ToolError("the call was aborted: its session ended") from None
            task.cancel()  # our caller was cancelled: the request goes too (the SDK tells the connector)
            await asyncio.wait({task})  # its cancellation is a few steps, bounded by the SDK's own send
            raise

    def abort(self) -> int:
        """Cancel every request of this session in flight, and refuse later ones; returns how many."""
        self._aborted = True
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        return len(calls)


def _cancelling() -> bool:
    """Whether the current task itself is being cancelled (rather than a task it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
