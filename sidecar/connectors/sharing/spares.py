"""Warm spare connector processes: started before a session needs them, handed to the first that does.

For a connector whose launch config has nothing per session in it (``ConnectorSpec.session_free``), a
process started now is exactly the one a new session's first call would start, so the pool keeps up to
``per_connector`` of them ready (contract §7). The rules this module holds:

* **After a take.** A spare is started in the background when a session has taken a process of the
  connector (a spare, or a cold start), never at daemon start: an unused connector costs nothing. It
  starts ``START_DELAY`` later, so that its spawn (a fork of the daemon, then seconds of CPU for a
  Python SDK server to import) does not compete with the call that took the previous one.
* **Within the caps.** Spares count against ``PoolLimits.per_connector`` and ``total`` like any process,
  are started only while they leave a free place, and ``make_room`` stops one before a session's own
  process would be refused for want of the place it holds.
* **For the spec it was started for.** ``take`` hands over a spare only when the spec asked for is equal
  to the one it was started with (same launch config, so the same trust key), after the pool's own trust
  check; ``stop`` (untrust, a config change, shutdown) stops the connector's spares cleanly.
* **Never used twice.** A spare has served no session; a session's process never becomes a spare.

Spares are ``ConnectorProcess`` processes like any other: same environment scrubbing, the orphanage's
tag and reaping, the same bounded stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, Protocol, TypeVar

from sidecar.connectors.manifest.spec import ConnectorSpec
from sidecar.errors import SidecarError

__all__ = ["START_DELAY", "SpareSlot", "Spares"]

logger = logging.getLogger(__name__)


START_DELAY: Final = 0.5
"""Seconds between a take and the spare that replaces it (measured by ``scripts/bench_spares.py``: started
at once, the spawn made the taking call ~4x a warm one on a 2-core machine; 0.5 s later, ~2x)."""


class _Limits(Protocol):
    @property
    def per_connector(self) -> int: ...

    @property
    def total(self) -> int: ...


class SpareSlot(Protocol):
    """What the pool's slot offers here: its spec, its client once up, its stop and its holder task."""

    spec: ConnectorSpec | None
    client: Any
    stop: asyncio.Event
    holder: asyncio.Task[None] | None
    last_used: float


S = TypeVar("S", bound=SpareSlot)

Start = Callable[[ConnectorSpec, Callable[[], Any]], Awaitable[S]]
"""Start a process of the spec with that plan; returns its slot once it has answered ``initialize``."""


class Spares(Generic[S]):
    SESSION: Final = "(spare)"
    """The session id a spare's slot carries until a session takes it."""

    def __init__(
        self, per_connector: int, *, count: Callable[[str | None], int], limits: _Limits, start: Start[S]
    ) -> None:
        """``count`` counts every process against the caps (spares included, through the pool)."""
        self._per_connector = per_connector
        self._count = count
        self._limits = limits
        self._start = start
        self._ready: dict[str, list[S]] = {}
        self._starting: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def count(self, connector_id: str | None) -> int:
        """Spares up or starting, of one connector or of all."""
        if connector_id is None:
            return sum(len(v) for v in self._ready.values()) + sum(self._starting.values())
        return len(self._ready.get(connector_id, ())) + self._starting.get(connector_id, 0)

    def ready(self, connector_id: str) -> int:
        """Spares of the connector up now, ready to be taken."""
        return sum(1 for slot in self._ready.get(connector_id, ()) if slot.client is not None)

    def take(self, spec: ConnectorSpec) -> S | None:
        """A ready spare started for exactly ``spec``, now no longer a spare; ``None`` when there is none."""
        ready = self._ready.get(spec.id, [])
        for slot in list(ready):
            ready.remove(slot)
            if slot.spec == spec and slot.client is not None:
                return slot
            slot.stop.set()  # started for another config: it serves no one
        return None

    def replenish(self, spec: ConnectorSpec, plan: Callable[[], Any]) -> None:
        """Start a spare of ``spec`` in the background if it wants one and a place is free for it."""
        if self._per_connector <= 0 or self.count(spec.id) >= self._per_connector:
            return
        # Never the last free place: a session's process must not wait for a spare to stop.
        if self._count(spec.id) + 1 >= self._limits.per_connector or self._count(None) + 1 >= self._limits.total:
            return
        self._starting[spec.id] = self._starting.get(spec.id, 0) + 1
        task = asyncio.get_running_loop().create_task(self._warm(spec, plan), name=f"connector-{spec.id}-spare")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, spec: ConnectorSpec, plan: Callable[[], Any]) -> None:
        try:
            await asyncio.sleep(START_DELAY)
            slot = await self._start(spec, plan)
        except (SidecarError, OSError) as exc:  # refused, failed, or its plan's session ended meanwhile
            logger.info("no spare of connector %s: %s", spec.id, exc)
            return
        finally:
            self._starting[spec.id] -= 1
        self._ready.setdefault(spec.id, []).append(slot)
        logger.debug("connector %s: a spare is ready", spec.id)

    def lost(self, slot: S) -> None:
        """A spare's process ended (stopped, idle, or crashed): it is no longer one."""
        for ready in self._ready.values():
            if slot in ready:
                ready.remove(slot)

    def idle(self, before: float) -> list[S]:
        """Spares started before ``before`` (the pool's reaper stops them like any idle process)."""
        return [slot for ready in self._ready.values() for slot in ready if slot.last_used < before]

    async def make_room(self, connector_id: str) -> None:
        """Stop a spare if a process of ``connector_id`` would otherwise be refused by a cap it fills."""
        victim: S | None = None
        if self._count(connector_id) >= self._limits.per_connector and self._ready.get(connector_id):
            victim = self._ready[connector_id].pop(0)
        elif self._count(None) >= self._limits.total:
            for ready in self._ready.values():
                if ready:
                    victim = ready.pop(0)
                    break
        if victim is not None:
            victim.stop.set()
            if victim.holder is not None:
                await asyncio.wait({victim.holder})  # the holder's stop is bounded (process.STOP_BOUND)

    async def stop(self, connector_id: str | None) -> None:
        """Stop the spares of one connector (or all), those still starting too, and wait until they have."""
        starting = [
            task for task in self._tasks if connector_id is None or task.get_name() == f"connector-{connector_id}-spare"
        ]
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.wait(starting)  # each stops what it started (the pool's start_spare)
        victims = [
            slot
            for cid in list(self._ready)
            if connector_id is None or cid == connector_id
            for slot in self._ready.pop(cid)
        ]
        for slot in victims:
            slot.stop.set()
        holders = {slot.holder for slot in victims if slot.holder is not None}
        if holders:
            await asyncio.wait(holders)
