"""Sessions owned by a process: a session that ``sidecar exec`` made ends when that process is gone.

``sidecar exec`` ends its session when the agent exits, but a SIGKILL of ``sidecar exec`` itself runs
none of its code. So its session names its owner, the exec process, by (pid, start time) — a pid alone
is reused once its process is reaped, and a session must not live on for whichever process gets it next
— and the daemon looks every ``interval`` seconds, and keeps a pidfd of each owner where it can: a
session whose owner is gone is ended. ``sidecar exec`` also names its agent as a second owner, so an
agent that stops (SIGSTOP) its exec and exits still ends the session. The owner is
kept with the session across daemon restarts, and the first look after a start ends the sessions whose
owner died while the daemon was down.

Without ``/proc`` (macOS) there is no start time: the pid alone is checked (``kill(pid, 0)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Final

from sidecar.errors import NotFound, RequestRejected
from sidecar.system import pid_alive, read_stat

__all__ = ["CHECK_INTERVAL", "Owner", "watching_owners"]

logger = logging.getLogger(__name__)

CHECK_INTERVAL: Final = 1.0
"""Seconds between looks at the owners: how long a session may outlive its killed owner."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The process a session lives no longer than: its pid, and its start time where ``/proc`` tells it."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> Owner:
        """The running process ``pid`` now; ``RequestRejected`` when there is none."""
        if pid <= 1 or not pid_alive(pid):
            raise RequestRejected(f"owner process {pid} is not running")
        stat = read_stat(pid)
        return cls(pid, stat.start if stat is not None else None)

    def gone(self) -> bool:
        """Whether the process has exited (or its pid now names another process)."""
        if self.start is None:
            return not pid_alive(self.pid)
        stat = read_stat(self.pid)
        return stat is None or stat.dead or stat.start != self.start


@contextlib.asynccontextmanager
async def watching_owners(
    owned: Callable[[], Iterable[tuple[str, Owner]]],
    end: Callable[[str], object],
    *,
    interval: float = CHECK_INTERVAL,
) -> AsyncIterator[None]:
    """While inside, end (``end(session_id)``) every session of ``owned()`` whose owner is gone.

    Each look (every ``interval`` seconds) also opens a pidfd for each owner it finds alive, where the
    platform has them (Linux 5.3+): the session then ends the moment that process exits, not at the next
    look, and a pid reused meanwhile cannot be mistaken for the owner.
    """
    loop = asyncio.get_running_loop()
    pidfds: dict[tuple[str, Owner], int] = {}

    def forget(key: tuple[str, Owner]) -> None:
        fd = pidfds.pop(key, None)
        if fd is not None:
            loop.remove_reader(fd)
            os.close(fd)

    def ended(session_id: str, owner: Owner) -> None:
        forget((session_id, owner))
        logger.info("session %s ends: its owner process %d exited", session_id, owner.pid)
        try:
            end(session_id)
        except NotFound:
            pass  # ended meanwhile
        except Exception:  # one failure must not stop the watch for every other session
            logger.exception("could not end session %s", session_id)

    async def watch() -> None:
        while True:
            live = set(owned())
            for key in [key for key in pidfds if key not in live]:
                forget(key)
            for session_id, owner in live:
                if owner.gone():
                    ended(session_id, owner)
                elif (session_id, owner) not in pidfds and (fd := _pidfd(owner)) is not None:
                    pidfds[(session_id, owner)] = fd
                    loop.add_reader(fd, ended, session_id, owner)  # readable once the process exits
            await asyncio.sleep(interval)

    task = asyncio.create_task(watch(), name="sidecar-session-owners")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for key in list(pidfds):
            forget(key)


def _pidfd(owner: Owner) -> int | None:
    """A pidfd of the owner's process, or None (no pidfds here, or the process is gone or not the owner)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(owner.pid)
    except OSError:
        return None
    if owner.gone():  # SECURITY: the pid may name another process by now; the fd must be the owner's
        os.close(fd)
        return None
    return fd
