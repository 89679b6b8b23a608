"""What the operating system says about processes: liveness, ``/proc/<pid>/stat``, and process trees.

The only module that reads ``/proc``, signals process groups or asks the kernel to make this process a
subreaper. Linux has ``/proc``; elsewhere (macOS, BSD) ``read_stat`` answers ``None``, ``pid_alive``
falls back to ``kill(pid, 0)``, a ``ProcessTree`` records nothing and ``set_child_subreaper`` answers
False, so only the process group can be killed.

A process is named by (pid, start time), never by pid alone: a pid is reused as soon as its process is
reaped, and signalling a recorded pid that now names someone else's process would be a bug with teeth.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "PortHolder",
    "ProcStat",
    "ProcessTree",
    "direct_children",
    "environ_value",
    "is_child_subreaper",
    "pid_alive",
    "port_holders",
    "proc_table",
    "read_stat",
    "reap",
    "set_child_subreaper",
    "signal_group",
]

logger = logging.getLogger(__name__)

_DEAD_STATES: Final = frozenset({"Z", "X"})
"""``/proc`` states of a process that has exited: zombie (not yet reaped) and dead."""
_STAT_BYTES: Final = 4096
"""One read of ``/proc/<pid>/stat``: the line is a few hundred bytes even with a 15-character comm."""
_ENVIRON_CHUNK: Final = 64 * 1024
_ENVIRON_LIMIT: Final = 2 * 1024 * 1024
"""Bytes of ``/proc/<pid>/environ`` read at most: Linux caps argv + environment at exec near this."""
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37
"""prctl(2) options since Linux 3.4."""


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


@dataclass(frozen=True, slots=True)
class PortHolder:
    """A socket listening on a TCP port: whose it is, and which process holds it when we may see that."""

    uid: int
    pid: int | None
    """None when no process of ours has the socket open (another user's, or one we may not inspect)."""
    command: str
    """Its command line (NULs as spaces), empty when ``pid`` is None."""


_LISTEN: Final = "0A"
"""``st`` of a listening socket in ``/proc/net/tcp`` (TCP_LISTEN, include/net/tcp_states.h)."""
_CMDLINE_BYTES: Final = 4096


def port_holders(port: int) -> list[PortHolder]:
    """The sockets listening on TCP ``port`` (any address, IPv4 or IPv6) and the processes holding them,
    from ``/proc/net/tcp{,6}`` and the ``/proc/<pid>/fd`` links we may read; [] without ``/proc``."""
    sockets: dict[int, int] = {}  # inode -> uid
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        # proc(5): "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode"
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == _LISTEN and fields[1].rpartition(":")[2] == f"{port:04X}":
                with contextlib.suppress(ValueError):
                    sockets[int(fields[9])] = int(fields[7])
    holders = {inode: PortHolder(uid, None, "") for inode, uid in sockets.items()}
    wanted = {f"socket:[{inode}]": inode for inode in sockets}
    for entry in os.listdir("/proc") if wanted else ():
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                inode = wanted.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
                if inode is not None and holders[inode].pid is None:
                    holders[inode] = PortHolder(sockets[inode], int(entry), _command_line(int(entry)))
    return list(holders.values())


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read(_CMDLINE_BYTES)
    except OSError:
        return ""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", errors="replace")


def set_child_subreaper() -> bool:
    """Make this process the parent of last resort of its descendants: an orphan anywhere below it is
    re-parented to it rather than to PID 1 (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4+). It must then
    reap what it adopts. Returns whether it now is one (False off Linux, or when the call fails).

    Process-wide and for the process's life: only a process that knows every child it starts should ask.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        logger.warning("could not become a child subreaper: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


def is_child_subreaper() -> bool:
    """Whether this process is a child subreaper (False off Linux)."""
    prctl = _prctl()
    if prctl is None:
        return False
    flag = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.cast(ctypes.pointer(flag), ctypes.c_void_p).value or 0, 0, 0, 0) != 0:
        return False
    return flag.value != 0


def _prctl() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def environ_value(pid: int, name: str) -> str | None:
    """The value of ``name`` in the environment ``pid`` was started with (``/proc/<pid>/environ``), or None:
    not set, not readable (another user's, a zombie, gone, no ``/proc``), or past ``_ENVIRON_LIMIT``.

    The environment a process was exec'd with, or inherited at fork; a process that clears it before
    exec'ing (``env -i``) shows none."""
    wanted = name.encode("ascii") + b"="
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        while size < _ENVIRON_LIMIT and (chunk := os.read(fd, _ENVIRON_CHUNK)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    for entry in b"".join(chunks).split(b"\0"):
        if entry.startswith(wanted):
            return entry[len(wanted) :].decode("utf-8", errors="replace")
    return None


def direct_children() -> set[int]:
    """The pids whose parent is this process now (adopted orphans included), from each thread's
    ``/proc/self/task/<tid>/children``; from the process table where the kernel has no such file."""
    me = os.getpid()
    if not os.path.exists(f"/proc/self/task/{me}/children"):  # no /proc, or no CONFIG_PROC_CHILDREN
        table = proc_table(0)
        return {row.pid for row in table.values() if row.ppid == me} if table is not None else set()
    found: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        # A thread that ended meanwhile has no file any more.
        with contextlib.suppress(FileNotFoundError), open(f"/proc/self/task/{tid}/children", "rb") as handle:
            found.update(int(pid) for pid in handle.read().split())
    return found


def reap(pid: int) -> int | None:
    """Collect the exit status of child ``pid`` if it has exited (``waitpid(pid, WNOHANG)``), else None.

    Only ever a given pid, never ``waitpid(-1)``: a caller reaps what it knows no one else waits for."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if done == pid else None


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


def proc_table(max_age: float) -> Mapping[int, ProcStat] | None:
    """Every process's stat line, from a snapshot at most ``max_age`` seconds old (shared by all callers);
    None without ``/proc``."""
    return _PROC_TABLE.get(max_age)


class ProcessTree:
    """The descendants of one process-group leader, recorded while they can still be found.

    A descendant that calls ``setsid`` is out of reach of ``killpg``, and once its parent dies nothing
    links it to the leader. So ``scan`` walks the whole process table from the leader (by parent, and by
    group or session membership, which outlives the parent) and records every descendant as (pid, start
    time); ``kill`` later signals only those whose pair still matches. What a double fork hides between
    two scans (an orphan that called ``setsid``) is out of its reach unless this process is a subreaper
    that adopted it and ``adopted`` says whose it is (``sidecar.connectors.stdio.orphans``), or a cgroup holds it.
    """

    def __init__(
        self,
        leader: int,
        *,
        limit: int,
        name: str = "",
        adopted: Callable[[Mapping[int, ProcStat]], Iterable[int]] | None = None,
    ) -> None:
        """``leader`` leads its own session and process group (``start_new_session``); ``limit`` caps the
        descendants recorded; ``name`` labels log lines. ``adopted(table)`` names orphans of the leader's
        tree that this process adopted as a subreaper (nothing in ``/proc`` links them to the leader any
        more): they and their descendants are recorded too."""
        self.leader = leader
        self._limit = limit
        self._name = name or str(leader)
        self._adopted = adopted
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
        if self._adopted is not None:
            roots.extend(self._adopted(table))
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
