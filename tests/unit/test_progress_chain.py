"""A relayed request's progress goes on in order, and its response waits for the last of it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from sidecar.connectors.progress import ProgressChain, in_order

WAIT = 5.0


def _slow_relay(order: list[str]) -> ProgressChain:
    async def relay(progress: float, total: float | None, message: str | None) -> None:
        for _ in range(int(10 - 3 * progress)):  # the earlier, the slower: started first is not done first
            await asyncio.sleep(0)
        if message == "fail":
            raise RuntimeError("the client's stream is gone")
        order.append(f"progress {progress:g}")

    return ProgressChain(relay)


async def test_progress_handed_over_by_a_spawning_dispatcher_is_relayed_in_order_before_the_answer() -> None:
    # What the SDK's dispatcher does: a task of its own per notification, then (a callback later, from
    # its read loop) the response.
    order: list[str] = []
    chain = _slow_relay(order)
    loop = asyncio.get_running_loop()
    response: asyncio.Future[str] = loop.create_future()
    spawned = [asyncio.create_task(chain.follow(step, None, None)) for step in (1, 2, 3)]
    loop.call_soon(response.set_result, "result")
    async with asyncio.timeout(WAIT):
        order.append(await chain.answer(response))
        await asyncio.gather(*spawned)
    assert order == ["progress 1", "progress 2", "progress 3", "result"]


async def test_an_error_answer_also_waits_and_a_failed_relay_does_not_stop_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    chain = _slow_relay(order)
    chain.spawn(1, 3, "fail")
    chain.spawn(2, 3, None)
    response: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    response.set_exception(MCPError(code=-32000, message="no"))
    with caplog.at_level(logging.ERROR, logger="sidecar.connectors.progress"):
        async with asyncio.timeout(WAIT):
            with pytest.raises(MCPError):
                await chain.answer(response)
    assert order == ["progress 2"]
    assert "progress callback raised" in caplog.text


async def test_a_cancelled_call_does_not_wait_for_a_relay_that_hangs() -> None:
    hanging = asyncio.Event()

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        hanging.set()
        await asyncio.Event().wait()  # a client that never reads

    chain = ProgressChain(relay)
    chain.spawn(1, None, None)
    response: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    call = asyncio.create_task(chain.answer(response))
    async with asyncio.timeout(WAIT):
        await hanging.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert response.cancelled()


async def test_in_order_gives_the_dispatcher_a_chained_callback_and_leaves_a_quiet_request_alone() -> None:
    order: list[str] = []
    relay = _slow_relay(order).follow  # any Progress: the slow relay, as the caller's callback
    spawned: list[asyncio.Task[None]] = []

    async def send(options: Any) -> str:  # as the SDK's dispatcher: a task per progress, then the response
        spawned.extend(asyncio.create_task(options["on_progress"](step, None, None)) for step in (1, 2, 3))
        await asyncio.sleep(0)  # its read loop yields before it reads the response
        return "result"

    async with asyncio.timeout(WAIT):
        order.append(await in_order(send, {"on_progress": relay}))
        await asyncio.gather(*spawned)
        assert await in_order(lambda options: asyncio.sleep(0, options), {}) == {}
    assert order == ["progress 1", "progress 2", "progress 3", "result"]
