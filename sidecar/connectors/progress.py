"""A relayed request's progress, sent on to the client one notification after the other.

A relay hands each ``notifications/progress`` it reads to a callback that sends it on the client's
stream, and the SDK's dispatcher (like the raw lane) runs each callback in a task of its own. A task
started first is not a task finished first: a send that needs a few more loop turns could finish after
the next one, or after the caller has sent the response, which closes the client's stream and loses
it (the conformance suite's ``tools-call-with-progress`` saw exactly that under load). ``ProgressChain``
starts each relay only when the one before it has finished, and ``delivered`` lets the caller wait for
the last before it sends the response. ``in_order`` does both for a request sent through the SDK's
dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError

from sidecar.bus.registry import Progress

__all__ = ["ProgressChain", "in_order"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ProgressChain:
    """One request's progress relays, in the order they were handed over; one that fails is logged."""

    def __init__(self, relay: Progress) -> None:
        self._relay = relay
        self._last: asyncio.Future[None] | None = None
        self._running: set[asyncio.Task[None]] = set()  # spawned relays, held until done

    def spawn(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay one notification in a task of its own, after every one handed over before it."""
        task = asyncio.ensure_future(self._after(self._link(), progress, total, message))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def follow(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay one notification in the calling task, after every one handed over before it (a ``Progress``
        to give a dispatcher that spawns its own task per notification)."""
        await self._after(self._link(), progress, total, message)

    async def answer(self, call: Awaitable[T]) -> T:
        """Await ``call`` (the request), then the relay of every progress it had, before its result or its
        ``MCPError`` goes on; a call cancelled or timed out does not wait for them."""
        try:
            result = await call
        except MCPError:
            await self.delivered()
            raise
        await self.delivered()
        return result

    async def delivered(self) -> None:
        """Return once every notification handed over so far has been relayed (or its relay failed)."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait((last,))

    def _link(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """Take the next place in the chain now, at hand-over: (the relay before it, this one's end)."""
        before = self._last
        self._last = done = asyncio.get_running_loop().create_future()
        return before, done

    async def _after(
        self,
        link: tuple[asyncio.Future[None] | None, asyncio.Future[None]],
        progress: float,
        total: float | None,
        message: str | None,
    ) -> None:
        before, done = link
        try:
            if before is not None and not before.done():
                await asyncio.wait((before,))
            await self._relay(progress, total, message)
        except Exception:  # a failed relay never touches the call it reports on
            logger.exception("progress callback raised")
        finally:
            done.set_result(None)


async def in_order(send: Callable[[CallOptions], Awaitable[T]], options: CallOptions) -> T:
    """``send(options)`` (a request through the SDK's dispatcher), its ``on_progress`` relayed in order and
    all of it before the answer returns (``ProgressChain``); as it is when it asks for no progress."""
    on_progress = options.get("on_progress")
    if on_progress is None:
        return await send(options)
    chain = ProgressChain(on_progress)
    return await chain.answer(send({**options, "on_progress": chain.follow}))
