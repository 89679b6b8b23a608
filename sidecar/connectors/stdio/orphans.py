"""The daemon as the parent of last resort for what a connector leaves behind (issue 11 item 5).

A connector may double-fork a process that calls ``setsid`` at once: its parent exits, it leads a session
of its own, and nothing in ``/proc`` links it to the connector any more, so a periodic scan that comes
later finds no trace of it (``sidecar.system.ProcessTree``). On Linux two things close that gap:

* **The daemon is a child subreaper** (``prctl(PR_SET_CHILD_SUBREAPER)``): such an orphan is re-parented
  to the daemon instead of PID 1. It is then one of the daemon's own children, never out of sight.
* **Each connector process's environment carries a tag** (``SIDECAR_CONNECTOR_TREE=<16 hex>``, one per
  process), which everything it starts inherits unless it clears its environment. An adopted orphan is
  attributed by the tag in ``/proc/<pid>/environ``, and the connector process's stop kills it with the
  rest of its tree (``ProcessTree(adopted=...)``, then ``release``). An orphan whose tag cannot be read
  (it cleared its environment, or changed user) is attributed to every connector process that was running
  when it was born, and dies with the first of them to stop: killing a little too much is the safe side.
  A warm spare and a shared process (``spares``, ``shared``) are connector processes like any: tagged at
  spawn, so what they leave behind is attributed and killed with them, whether or not a session took it.

The daemon also reaps: every ``REAP_INTERVAL`` seconds it collects the exit status of each adopted child
that has exited, by pid (never ``waitpid(-1)``), never a connector process itself (asyncio's child watcher
waits for those), and never while a spawn is under way (the new child's pid is not registered yet). The
same sweep kills an adopted orphan whose tree is gone (one adopted after its connector's stop). When the
daemon stops, whatever it adopted and still runs is killed.

Only a process that exists to be the daemon (``serve(dedicated=True)``) becomes a subreaper. The attribute
is process-wide: a process that hosts ``serve()`` among other work (the test runner) has children of its
own, whose orphans it must not adopt and whose exit statuses it must not take. There, and off Linux, the
``ProcessTree`` scan is the fallback. A cgroup per connector would hold even a process that clears its
environment, but needs a delegated cgroup v2 subtree, which a user's daemon does not have everywhere (the
project's test VM has cgroup v1 only). A descendant that asks something outside the tree to start a
process (``systemd-run``, ``at``) is beyond any of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from sidecar.system import (
    ProcStat,
    direct_children,
    environ_value,
    read_stat,
    reap,
    set_child_subreaper,
    signal_group,
)

__all__ = ["ORPHANAGE", "REAP_INTERVAL", "TREE_VARIABLE", "Orphanage"]

logger = logging.getLogger(__name__)

TREE_VARIABLE: Final = "SIDECAR_CONNECTOR_TREE"
"""The environment variable that tags a connector process and everything it starts."""
REAP_INTERVAL: Final = 1.0
"""Seconds between sweeps: how long an exited orphan may stay a zombie, and how late one adopted after its
connector stopped is killed. A sweep reads one ``children`` file per daemon thread and one stat line per
adopted child: tens of microseconds."""
KILL_WAIT: Final = 2.0
"""Seconds the daemon's stop waits for what it adopted to die after SIGKILL (a process stuck in the
kernel, state D, is the only one that takes longer)."""
_POLL: Final = 0.02
_TAG: Final = re.compile(r"[0-9a-f]{16}")
_MAX_CACHED: Final = 4096
"""Tags remembered per (pid, start time); past this the cache starts over (a re-read costs one file)."""


@dataclass(slots=True)
class _Tree:
    """One connector process's tree: its leader once spawned, and the leader's start time (clock ticks)."""

    leader: int | None = None
    start: int | None = None


class Orphanage:
    """Adopt, attribute, kill and reap the orphans of connector processes (see the module docstring).

    Everything runs on the event loop's thread: connector processes are started and stopped there.
    """

    def __init__(self) -> None:
        self._active = False
        self._trees: dict[str, _Tree] = {}
        self._leaders: set[int] = set()
        self._spawning = 0
        self._tags: dict[tuple[int, int], str | None] = {}
        self.reaped = 0
        """Adopted children whose exit status the sweeps collected."""
        self.killed = 0
        """Adopted orphans killed because their tree was gone or stopping."""

    @property
    def active(self) -> bool:
        """Whether this process is the subreaper and tags connector processes."""
        return self._active

    def activate(self) -> bool:
        """Make this process the subreaper of its connectors' trees (Linux); returns whether it now is."""
        if not self._active and set_child_subreaper():
            self._active = True
            logger.info("this daemon adopts orphans of connector processes (child subreaper) and reaps them")
        return self._active

    # -- one connector process -------------------------------------------------------------------------

    def new_tree(self) -> str | None:
        """A tag for a connector process about to be spawned (its environment carries it), or None when
        not active (the environment is then left exactly as given)."""
        if not self._active:
            return None
        tag = secrets.token_hex(8)
        self._trees[tag] = _Tree()
        return tag

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Hold reaping while a child is forked and not yet ``planted``: its exit status is asyncio's."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1

    def planted(self, tag: str | None, pid: int) -> None:
        """The connector process of ``tag`` runs as ``pid``: never reap it, and date its tree."""
        tree = self._trees.get(tag) if tag is not None else None
        if tree is None:
            return
        stat = read_stat(pid)
        tree.leader, tree.start = pid, stat.start if stat is not None else None
        self._leaders.add(pid)

    def adopted(self, tag: str | None, table: Mapping[int, ProcStat]) -> list[int]:
        """The live orphans this process adopted that belong to the tree of ``tag``: those tagged with it,
        and untagged ones born after its leader (``ProcessTree``'s ``adopted``)."""
        tree = self._trees.get(tag) if tag is not None else None
        if tree is None:
            return []
        me = os.getpid()
        return [row.pid for row in table.values() if row.ppid == me and self._belongs(row, tag, tree)]

    def release(self, tag: str | None, *, leader_collected: bool = True) -> None:
        """The tree of ``tag`` has been killed: kill any adopted orphan of it still alive, and forget it.

        ``leader_collected``: asyncio has the leader's exit status; until then (a leader that survived
        SIGKILL) its pid stays one the sweeps never reap."""
        tree = self._trees.pop(tag, None) if tag is not None else None
        if tree is None:
            return
        if tree.leader is not None and leader_collected:
            self._leaders.discard(tree.leader)
        self._kill(row for row in self._adopted_rows() if self._belongs(row, tag, tree))

    # -- the sweep ---------------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Reap every adopted child that has exited; kill every adopted orphan whose tree is gone."""
        if not self._active:
            return
        for row in self._adopted_rows(include_dead=True):
            if row.dead:
                # SECURITY (of the daemon's own bookkeeping): a pid being spawned may not be planted yet,
                # and its exit status belongs to asyncio.
                if self._spawning == 0 and reap(row.pid) is not None:
                    self.reaped += 1
                continue
            if not self._owned(row):
                self._kill([row])
        if len(self._tags) > _MAX_CACHED:
            self._tags.clear()

    async def close(self) -> None:
        """At the daemon's stop, after every connector process stopped: kill what is left, reap it."""
        if not self._active:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KILL_WAIT
        while True:
            rows = self._adopted_rows(include_dead=True)
            self._kill(row for row in rows if not row.dead)
            for row in rows:
                if row.dead and reap(row.pid) is not None:
                    self.reaped += 1
            if not rows or loop.time() >= deadline:
                break
            await asyncio.sleep(_POLL)
        if rows:
            logger.warning("%d adopted processes outlived the stop: %s", len(rows), sorted(r.pid for r in rows))

    @contextlib.asynccontextmanager
    async def sweeping(self) -> AsyncIterator[None]:
        """Sweep every ``REAP_INTERVAL`` seconds for the block's duration; ``close`` at its end."""
        task = asyncio.create_task(self._sweep_forever(), name="orphanage sweep") if self._active else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.close()

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL)
            try:
                self.sweep()
            except Exception:
                logger.exception("orphan sweep failed; trying again in %gs", REAP_INTERVAL)

    # -- helpers -----------------------------------------------------------------------------------------

    def _adopted_rows(self, *, include_dead: bool = False) -> list[ProcStat]:
        """This process's children other than connector processes: what it adopted."""
        rows = []
        for pid in direct_children() - self._leaders:
            row = read_stat(pid)
            if row is not None and (include_dead or not row.dead):
                rows.append(row)
        return rows

    def _belongs(self, row: ProcStat, tag: str | None, tree: _Tree) -> bool:
        if row.pid in self._leaders or row.dead:
            return False
        owner = self._tag_of(row)
        if owner is not None:
            return owner == tag
        return tree.start is not None and row.start >= tree.start

    def _owned(self, row: ProcStat) -> bool:
        """Whether a live tree may still claim ``row`` (so the sweep leaves it to that tree's stop)."""
        if self._spawning:
            return True  # a child forked but not yet exec'd has the daemon's environment: no tag yet
        owner = self._tag_of(row)
        if owner is not None:
            return owner in self._trees
        return any(tree.start is not None and tree.start <= row.start for tree in self._trees.values())

    def _tag_of(self, row: ProcStat) -> str | None:
        key = (row.pid, row.start)
        if key not in self._tags:
            value = environ_value(row.pid, TREE_VARIABLE)
            self._tags[key] = value if value is not None and _TAG.fullmatch(value) else None
        return self._tags[key]

    def _kill(self, rows: Iterable[ProcStat]) -> None:
        for row in rows:
            # SECURITY: (pid, start time) still names the process attributed; then its group, if it leads one.
            current = read_stat(row.pid)
            if current is None or current.start != row.start or current.dead:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(row.pid, signal.SIGKILL)
            if current.pgrp == row.pid:
                signal_group(row.pid, signal.SIGKILL)
            self.killed += 1
            logger.info("killed pid %d, an orphan of a connector's tree that its stop left behind", row.pid)


ORPHANAGE: Final = Orphanage()
"""The process's one orphanage (a subreaper is process-wide): ``daemon.serve(dedicated=True)`` activates it."""
