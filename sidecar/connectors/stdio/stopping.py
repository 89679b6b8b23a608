"""The bounded steps of stopping a child process: naming its exit, polling with a deadline, closing its
stdin, and releasing asyncio's transport once it is gone (``process.ConnectorProcess`` composes them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Final

__all__ = ["STOP_POLL", "close_stdin", "describe_exit", "until"]

logger = logging.getLogger(__name__)

STOP_POLL: Final = 0.01
"""Seconds between checks while stopping (the SDK polls at the same rate)."""


def describe_exit(returncode: int) -> str:
    """A returncode in words: ``exited with code 3``, ``killed by SIGKILL``."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


async def until(condition: Callable[[], bool], seconds: float, *, absorb_cancel: bool = True) -> bool:
    """Poll ``condition`` until true (True) or ``seconds`` pass (False).

    In the shutdown task a cancel is absorbed, not obeyed: the wait is bounded, and a teardown cut halfway
    would leak the tree (STYLE habit 7). Event-loop teardown cancels every task and then waits for them, so
    the shutdown still completes, and the child's exit is observed before the loop closes (otherwise asyncio's
    Popen is collected "still running").
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, seconds)
    while not condition():
        if loop.time() >= deadline:
            return False
        try:
            await asyncio.sleep(STOP_POLL)
        except asyncio.CancelledError:
            if not absorb_cancel:
                raise
            logger.debug("cancel during a connector stop absorbed; the stop is bounded and finishes first")
    return True


def close_stdin(proc: asyncio.subprocess.Process, *, graceful: bool = False) -> None:
    """Close the connector's stdin: gracefully (after buffered writes) to ask it to exit, or abort at the end."""
    if proc.stdin is None or proc.stdin.transport.is_closing():
        return
    with contextlib.suppress(OSError, RuntimeError):
        if graceful:
            proc.stdin.close()
        else:
            proc.stdin.transport.abort()
