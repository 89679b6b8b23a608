"""What the operating system says about processes: liveness, ``/proc/<pid>/stat``, and process trees.

The only module that reads ``/proc`` or signals process groups. Linux has ``/proc``; elsewhere (macOS,
BSD) ``read_stat`` answers ``None``, ``pid_alive`` falls back to ``kill(pid, 0)`` and a ``ProcessTree``
records nothing, so only the process group can be killed.

A process is named by (pid, start time), never by pid alone: a pid is reused as soon as its process is
reaped, and signalling a recorded pid that now names someone else's process would be a bug with teeth.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["ProcStat", "ProcessTree", "pid_alive", "read_stat", "signal_group"]

logger = logging.getLogger(__name__)

_DEAD_STATES: Final = frozenset({"Z", "X"})
"""``/proc`` states of a process that has exited: zombie (not yet reaped) and dead."""
_STAT_BYTES: Final = 4096
"""One read of ``/proc/<pid>/stat``: the line is a few hundred bytes even with a 15-character comm."""


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` line that process supervision needs."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str
    start: int
    """Start time in clock ticks since boot: with the pid, it names one process across pid reuse."""

    @property
    def dead(self) -> bool:
        """Exited (a zombie waiting to be reaped counts): nothing of it runs any more."""
        return self.state in _DEAD_STATES


def read_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat line, or ``None`` when it does not exist, cannot be read, or there is no ``/proc``."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        data = os.read(fd, _STAT_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    # proc(5): "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')', so split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return ProcStat(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode("ascii"), int(fields[19]))
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` may name a running process: ``False`` only when the system says it is gone.

    Gone: no such process, or a zombie (exited, not yet reaped). A pid that is not one (0, negative, too
    large) and a process of another user (``EPERM``) count as alive, so a caller that cleans up after dead
    processes leaves alone what it cannot reason about. Without ``/proc`` a zombie counts as alive.
    """
    if pid <= 0:
        return True  # 0 and -1 are "my group" and "everyone" to kill(): never a process of their own
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # EPERM: someone else's live process; OverflowError: not a pid at all
    stat = read_stat(pid)
    return stat is None or not stat.dead


def signal_group(pgid: int, signum: signal.Signals) -> None:
    """Signal every member of process group ``pgid``; a group that is gone already is no error."""
    # ESRCH: the group is gone. EPERM: we signalled what we may (macOS answers EPERM for zombies).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class _ProcTable:
    """A snapshot of every process's stat line, shared by all process trees for a short while."""

    def __init__(self) -> None:
        self._available = sys.platform == "linux" and os.path.isdir("/proc/self")
        self._taken = -math.inf
        self._rows: dict[int, ProcStat] = {}

    def get(self, max_age: float) -> Mapping[int, ProcStat] | None:
        """The table, rescanned if older than ``max_age`` seconds; None without /proc (macOS, BSD)."""
        if not self._available:
            return None
        now = time.monotonic()
        if now - self._taken >= max_age:
            rows = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit() and (row := read_stat(int(entry))) is not None:
                    rows[row.pid] = row
            self._rows, self._taken = rows, now
        return self._rows


_PROC_TABLE: Final = _ProcTable()


class ProcessTree:
    """The descendants of one process-group leader, recorded while they can still be found.

    A descendant that calls ``setsid`` is out of reach of ``killpg``, and once its parent dies nothing
    links it to the leader. So ``scan`` walks the whole process table from the leader (by parent, and by
    group or session membership, which outlives the parent) and records every descendant as (pid, start
    time); ``kill`` later signals only those whose pair still matches. What a double fork hides between
    two scans can only be caught with cgroups (or a subreaper, which is process-wide).
    """

    def __init__(self, leader: int, *, limit: int, name: str = "") -> None:
        """``leader`` leads its own session and process group (``start_new_session``); ``limit`` caps the
        descendants recorded; ``name`` labels log lines."""
        self.leader = leader
        self._limit = limit
        self._name = name or str(leader)
        stat = read_stat(leader)
        self._leader_start = stat.start if stat is not None else None
        self._tracked: dict[int, int] = {}  # pid -> start time of every descendant seen

    @property
    def recorded(self) -> frozenset[int]:
        """The pids recorded and alive at the last scan."""
        return frozenset(self._tracked)

    def scan(self, *, max_age: float, leader_running: bool) -> None:
        """Forget recorded descendants that died, then record every descendant found now.

        ``max_age``: seconds a table another tree scanned may be reused (0: read ``/proc`` now; a scan
        reads one file per process on the machine). ``leader_running``: the leader has not been reaped, so its children
        are ours too (after it is reaped its pid may name someone else's process).
        """
        table = _PROC_TABLE.get(max_age)
        if table is None:
            return
        me = self.leader
        self._tracked = {
            pid: start
            for pid, start in self._tracked.items()
            if (row := table.get(pid)) is not None and row.start == start and not row.dead
        }
        leader = table.get(me)
        roots = list(self._tracked)
        if leader_running and leader is not None and leader.start == self._leader_start:
            roots.append(me)
        children: dict[int, list[int]] = {}
        for row in table.values():
            children.setdefault(row.ppid, []).append(row.pid)
            # Members of our group or session are ours even when orphaned (a setpgid escapee stays in the
            # session). The ids cannot be reused while any member lives.
            if row.pid != me and me in (row.pgrp, row.session):
                roots.append(row.pid)
        seen: set[int] = set()
        while roots:
            pid = roots.pop()
            if pid not in seen:
                seen.add(pid)
                roots.extend(children.get(pid, ()))
        seen -= {me, os.getpid(), 0, 1}
        for pid in sorted(seen):
            row = table.get(pid)
            if row is None or row.dead or pid in self._tracked:
                continue
            if len(self._tracked) >= self._limit:
                logger.warning("%s: over %d descendants; not recording more", self._name, self._limit)
                break
            self._tracked[pid] = row.start

    def kill(self) -> None:
        """SIGKILL the leader's group, then every recorded descendant that is still the process recorded
        (and, for one that leads a group of its own, that group: members never seen by a scan)."""
        signal_group(self.leader, signal.SIGKILL)
        for pid, start in self._tracked.items():
            row = read_stat(pid)
            if row is None or row.start != start or row.dead:
                continue  # gone, or the pid now names another process
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            if row.pgrp == pid:  # it leads its own group (setsid): take the members we never saw too
                signal_group(pid, signal.SIGKILL)

    def alive(self) -> bool:
        """Whether any member of the leader's group, or any recorded descendant, still runs."""
        table = _PROC_TABLE.get(0)
        if table is None:
            try:
                os.killpg(self.leader, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass  # EPERM never proves the group is gone
            return True
        return any(
            not row.dead and (row.pgrp == self.leader or self._tracked.get(row.pid) == row.start)
            for row in table.values()
        )
