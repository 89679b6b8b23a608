"""asyncio's subprocess transport, which ``asyncio.subprocess.Process`` keeps as ``_transport``."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["close_subprocess_transport"]


def close_subprocess_transport(proc: asyncio.subprocess.Process) -> None:
    """Close asyncio's subprocess transport, which otherwise stays open while a survivor holds a pipe.

    Nothing public exposes it (the SDK's stdio client does the same attribute walk).
    """
    transport = getattr(proc, "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(PermissionError):
            close()
