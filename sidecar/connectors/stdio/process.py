"""One connector subprocess: newline-delimited JSON-RPC on stdio, supervised so that nothing outlives it.

``ConnectorProcess`` spawns a connector exactly as configured (argv, no shell; the caller's env, nothing
merged in; its own session and process group), hands the MCP client a transport over its pipes, and
reports how it ended. The contract the tests hold:

* **Nothing leaks.** ``stop()`` escalates: close stdin → ``GRACE`` → SIGTERM the group → ``TERM_WAIT`` →
  SIGKILL the group → ``KILL_WAIT``; then it always SIGKILLs the group once more (children left behind by a
  leader that exited cleanly) and every recorded descendant that escaped the group (``setsid``,
  double-fork). A crash runs the same clean-up. ``stop()`` returns within ``STOP_BOUND`` seconds.
* **Escapees are recorded while they are still reachable.** The descendant tree (``sidecar.system.ProcessTree``)
  is read from ``/proc`` every ``TREE_SCAN_INTERVAL`` seconds and at every escalation step; each descendant
  is recorded as (pid, start time) and killed at the end only if that pair still matches (no pid reuse).
  Linux only; elsewhere only the process group is killed.
* **Even one that double-forks and calls ``setsid`` at once.** Where the daemon is a child subreaper
  (``orphans.ORPHANAGE`` active: ``sidecar serve``), the process is spawned with a tag in its environment
  (``SIDECAR_CONNECTOR_TREE``); an orphan of its tree is re-parented to the daemon, attributed by that tag
  (or, untagged, by its birth during this process's life), recorded with the tree and killed with it, and
  ``release`` at the end kills any that a scan never saw.
* **A misbehaving connector fails alone.** The pipes are framed by ``framing.StdioFraming``: a stdout line
  over ``max_line_bytes`` stops that connector (``exit_reason`` says why); a non-JSON line is logged and
  skipped. stdout EOF or process exit closes the read stream, so the client's pending calls fail at once
  (the SDK raises ``MCPError(CONNECTION_CLOSED)``).
* **A stop cannot be cut short.** ``stop()`` shields the one shutdown task, which absorbs cancels (its waits
  are bounded) so that event-loop teardown still sees it through; a shutdown cancelled before its first
  step kills the tree synchronously from its done-callback.
* stderr is drained continuously into a bounded tail (``framing.StderrTail``); the child never blocks on it.

State: ``starting → running → stopping → exited`` (or ``starting → exited`` when the spawn fails or is
stopped); anything else raises ``ProcessStateError`` naming both states.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from mcp.client import Transport

from sidecar.connectors.stdio.framing import StderrTail, StdioFraming
from sidecar.connectors.stdio.lane import RawLane
from sidecar.connectors.stdio.orphans import ORPHANAGE, TREE_VARIABLE, Orphanage
from sidecar.connectors.stdio.stopping import close_stdin, describe_exit, until
from sidecar.seams.asyncio_subprocess import close_subprocess_transport
from sidecar.system import ProcessTree, pid_alive, signal_group

__all__ = [
    "GRACE",
    "KILL_WAIT",
    "STOP_BOUND",
    "TERM_WAIT",
    "TREE_SCAN_INTERVAL",
    "ConnectorProcess",
    "ProcessLimits",
    "ProcessState",
    "ProcessStateError",
]

logger = logging.getLogger(__name__)

GRACE: Final = 2.0
"""Seconds a connector gets to exit on its own after stdin closes: the MCP spec's first shutdown step, and the
SDK's PROCESS_TERMINATION_TIMEOUT (an SDK 2.3 server takes ~0.5 s on the 2-core test VM)."""
TERM_WAIT: Final = 2.0
"""Seconds between SIGTERM to the group and SIGKILL: time to flush and clean up (the SDK's FORCE_KILL_TIMEOUT)."""
KILL_WAIT: Final = 2.0
"""Seconds for a SIGKILLed leader to be reaped; only a process stuck in the kernel (state D) runs this out."""
STOP_BOUND: Final = GRACE + TERM_WAIT + KILL_WAIT + 1.0
"""``stop()`` always returns within this many seconds; the last second covers the tree kill and pipe drain."""
TREE_SCAN_INTERVAL: Final = 2.0
"""Seconds between /proc scans for descendants: a scan reads every process's stat, shared by all
connectors (``_TABLE_REUSE``), so the period trades CPU against the double-fork window."""

_EXIT_POLL: Final = 0.1
"""Seconds between returncode checks while running: a crash whose pipes a descendant holds is noticed this late."""
_TREE_GONE_WAIT: Final = 0.5
"""Seconds for SIGKILLed group members and escapees to die after the final kill."""
_DRAIN_WAIT: Final = 0.2
"""Seconds to read what the dead tree left in stdout/stderr before the pipes are closed."""
_TABLE_REUSE: Final = 0.5
"""Seconds a periodic /proc snapshot serves other connectors, so N connectors do not mean N scans."""
_MAX_TRACKED: Final = 1024
"""Descendants recorded per connector; a connector forking past this is beyond what pid tracking can hold."""
_STOPPED: Final = "stopped"
"""The exit reason of a process that ended because ``stop()`` asked it to."""


class ProcessState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"


_TRANSITIONS: Final[Mapping[ProcessState, frozenset[ProcessState]]] = {
    ProcessState.STARTING: frozenset({ProcessState.RUNNING, ProcessState.EXITED}),
    ProcessState.RUNNING: frozenset({ProcessState.STOPPING}),
    ProcessState.STOPPING: frozenset({ProcessState.EXITED}),
    ProcessState.EXITED: frozenset(),
}


class ProcessStateError(RuntimeError):
    """An illegal lifecycle transition: a bug in the caller, never a connector's fault."""


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    max_line_bytes: int = 4 * 1024 * 1024
    """Longest stdout line (one JSON-RPC message) accepted; a longer one stops the connector."""
    stderr_lines: int = 200
    """stderr lines kept in the tail; the last of them are what ``connectors show`` reports after a failure."""
    start_timeout: float = 30.0
    """Seconds the spawn may take here; the supervisor bounds the MCP handshake with the same value."""

    def __post_init__(self) -> None:
        for field in ("max_line_bytes", "stderr_lines", "start_timeout"):
            if not getattr(self, field) > 0:
                raise ValueError(f"ProcessLimits.{field} must be positive, got {getattr(self, field)!r}")


class ConnectorProcess:
    """One connector subprocess speaking newline-delimited JSON-RPC on stdio, with supervision hooks."""

    # Created with the process: its pipes as message streams, and its descendants.
    _framing: StdioFraming
    _tree: ProcessTree

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        limits: ProcessLimits = ProcessLimits(),
        name: str = "",
        orphanage: Orphanage = ORPHANAGE,
    ) -> None:
        if not argv:
            raise ValueError("argv must name a program")
        self._argv = tuple(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._limits = limits
        self.name = name or os.path.basename(self._argv[0])
        self.exited = asyncio.Event()
        """Set once the process has exited and its tree has been killed (crash or stop)."""
        self._state = ProcessState.STARTING
        self._proc: asyncio.subprocess.Process | None = None
        self._exit_reason: str | None = None
        self._stderr = StderrTail(limits.stderr_lines)
        self._attached = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None
        self._orphanage = orphanage
        self._tag: str | None = None

    # -- read-only facts -------------------------------------------------------------------------------------

    @property
    def state(self) -> ProcessState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def pgid(self) -> int | None:
        # start_new_session makes the child a session and group leader: pgid == pid, even after it is reaped
        # (getpgid() would fail then, while members may live on).
        return self.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    @property
    def exit_reason(self) -> str | None:
        """Why it ended: ``exited with code 3``, ``killed by SIGKILL``, ``line over N bytes``, ``stopped``."""
        return self._exit_reason

    @property
    def failed(self) -> bool:
        """It ended without ``stop()`` asking it to: it exited or was killed on its own, failed to start, or
        broke the framing (the first reason wins, so a stop after it died on its own does not hide that)."""
        return self._exit_reason is not None and self._exit_reason != _STOPPED

    @property
    def stderr_tail(self) -> list[str]:
        """The last ``stderr_lines`` lines of stderr (each cut at 4 KiB), oldest first."""
        return self._stderr.lines

    async def wait_for_stderr(self, predicate: Callable[[str], bool]) -> str | None:
        """The first tail line matching ``predicate``, waiting for more; None once stderr has closed.

        Unbounded by itself: callers wrap it in ``asyncio.timeout``.
        """
        return await self._stderr.wait_for(predicate)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def _set_state(self, new: ProcessState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise ProcessStateError(f"connector {self.name!r}: illegal transition {self._state} -> {new}")
        self._state = new

    async def __aenter__(self) -> ConnectorProcess:
        if self._state is not ProcessState.STARTING or self._proc is not None:
            raise ProcessStateError(f"connector {self.name!r}: illegal transition {self._state} -> running")
        self._tag = self._orphanage.new_tree()
        env = self._env
        if self._tag is not None:
            # SECURITY: first, and the config cannot set it: what this process starts inherits it, and an
            # orphan the daemon adopts is attributed by it (orphans module).
            env = {TREE_VARIABLE: self._tag, **{k: v for k, v in env.items() if k != TREE_VARIABLE}}
        try:
            async with asyncio.timeout(self._limits.start_timeout):
                # SECURITY: argv as given, no shell; exactly the caller's (scrubbed) env plus the tree's tag;
                # a new session so the whole group can be signalled; no preexec_fn (unsafe with threads,
                # ruff PLW1509).
                with self._orphanage.spawning():
                    proc = await asyncio.create_subprocess_exec(
                        *self._argv,
                        env=env,
                        cwd=self._cwd,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        start_new_session=True,
                        limit=self._limits.max_line_bytes,  # the framing's line bound: readline() raises past it
                    )
                    self._orphanage.planted(self._tag, proc.pid)
        except (OSError, ValueError, TimeoutError) as exc:
            self._orphanage.release(self._tag)
            self._exit_reason = f"failed to start: {type(exc).__name__}: {exc}"
            if self._state is ProcessState.STARTING:
                self._set_state(ProcessState.EXITED)
            self.exited.set()
            raise
        except BaseException:
            self._orphanage.release(self._tag)
            raise
        self._proc = proc
        if self._state is not ProcessState.STARTING:  # stop() ran while we were spawning
            await self._abandon(proc)
            raise ProcessStateError(f"connector {self.name!r}: stopped while starting")
        tag = self._tag
        self._tree = ProcessTree(
            proc.pid,
            limit=_MAX_TRACKED,
            name=f"connector {self.name}",
            adopted=(lambda table: self._orphanage.adopted(tag, table)) if tag is not None else None,
        )
        self._framing = StdioFraming(self.name, max_line_bytes=self._limits.max_line_bytes)
        self._set_state(ProcessState.RUNNING)
        logger.info("connector %s started: pid %d", self.name, proc.pid)
        if proc.stdout is None or proc.stderr is None:  # spawned with pipes; no assert under -OO
            raise ProcessStateError(f"connector {self.name!r}: started without its pipes")
        self._pump = self._spawn(self._framing.read_stdout(proc.stdout, on_overflow=self._request_stop), "stdout")
        self._stderr_task = self._spawn(self._stderr.drain(proc.stderr), "stderr")
        self._spawn(self._monitor(), "monitor")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop the connector and its whole tree; returns within ``STOP_BOUND`` seconds, even if cancelled.

        Idempotent. Called before ``__aenter__`` has spawned anything, it only marks the process exited (a
        spawn already under way is then killed by ``__aenter__``, which raises).
        """
        if self._state is ProcessState.EXITED:
            return
        if self._proc is None:
            self._exit_reason = _STOPPED
            self._set_state(ProcessState.EXITED)
            self.exited.set()
            return
        task = self._request_stop(None)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # Teardown cannot be interrupted halfway (STYLE habit 7); it is bounded, so finish it, then obey.
            await asyncio.wait({task})
            raise

    def _request_stop(self, reason: str | None) -> asyncio.Task[None]:
        """Start the one shutdown (first reason wins) and return it."""
        if self._shutdown is None:
            if self._proc is None:
                raise ProcessStateError(f"connector {self.name!r}: stop requested before it started")
            rc = self.returncode
            if reason is not None:
                self._exit_reason = reason
            elif rc is not None:
                self._exit_reason = describe_exit(rc)
            elif not self._ended_first(self._proc):
                self._exit_reason = _STOPPED
            # else: it ended on its own a moment ago and asyncio has not collected the code yet; the shutdown
            # names the exit once it has the code.
            self._set_state(ProcessState.STOPPING)
            self._shutdown = asyncio.create_task(self._run_shutdown(), name=f"connector {self.name} stop")
            self._shutdown.add_done_callback(self._after_shutdown)
        return self._shutdown

    def _after_shutdown(self, task: asyncio.Task[None]) -> None:
        """Last resort for a shutdown cancelled before its first step (event-loop teardown can do that):
        kill everything at once, synchronously, so that even then nothing outlives the connector."""
        if self._state is ProcessState.EXITED or self._proc is None:
            return
        logger.warning("connector %s: stop was cancelled before it began; killing its tree outright", self.name)
        self._tree.kill()
        self._orphanage.release(self._tag, leader_collected=self._proc.returncode is not None)
        try:
            self._release(self._proc)
        finally:
            self._name_exit(self._proc)
            self._set_state(ProcessState.EXITED)
            self.exited.set()

    async def _run_shutdown(self) -> None:
        proc = self._proc
        if proc is None:  # no assert: the daemon runs with -OO
            raise ProcessStateError(f"connector {self.name!r} has not started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_BOUND - 0.2
        try:
            await self._escalate(proc, deadline)
            # Always: same-group leftovers of a leader that exited on its own, then recorded escapees.
            self._scan_tree(max_age=0)
            self._tree.kill()
            self._orphanage.release(self._tag, leader_collected=proc.returncode is not None)
            if not await until(lambda: not self._tree.alive(), min(_TREE_GONE_WAIT, deadline - loop.time())):
                logger.warning("connector %s: processes of its tree survived SIGKILL", self.name)
            readers = [t for t in (self._pump, self._stderr_task) if t is not None]
            await until(lambda: all(t.done() for t in readers), min(_DRAIN_WAIT, deadline - loop.time()))
        except Exception:
            logger.exception("connector %s: stopping failed; closing its pipes anyway", self.name)
        finally:
            self._orphanage.release(self._tag, leader_collected=proc.returncode is not None)
            try:
                self._release(proc)
            except Exception:
                logger.exception("connector %s: releasing its pipes failed", self.name)
            finally:
                self._name_exit(proc)
                self._set_state(ProcessState.EXITED)
                self.exited.set()
                logger.info(
                    "connector %s (pid %d): %s; returncode %s", self.name, proc.pid, self._exit_reason, proc.returncode
                )

    def _ended_first(self, proc: asyncio.subprocess.Process) -> bool:
        """Whether the connector ended on its own before this stop: its stdout is at EOF, or it is gone.

        A process that exits closes its stdout before it becomes a zombie, and asyncio collects its code
        later still, so a stop that follows the EOF at once (the session failing on it) can come first.
        """
        return (self._pump is not None and self._pump.done()) or not pid_alive(proc.pid)

    def _name_exit(self, proc: asyncio.subprocess.Process) -> None:
        """Name an exit that ``_request_stop`` found the connector began on its own, now that the code is known."""
        if self._exit_reason is None:
            self._exit_reason = describe_exit(proc.returncode) if proc.returncode is not None else "exited"

    def _release(self, proc: asyncio.subprocess.Process) -> None:
        """End the session's read side, close our pipe ends and cancel the helper tasks."""
        self._framing.end_inbound()
        if not self._attached:  # otherwise the session owns (and closes) the read stream
            self._framing.inbound.close()
        close_stdin(proc)
        close_subprocess_transport(proc)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def _escalate(self, proc: asyncio.subprocess.Process, deadline: float) -> None:
        loop = asyncio.get_running_loop()

        def exited() -> bool:
            return proc.returncode is not None

        self._scan_tree(max_age=0)
        close_stdin(proc, graceful=True)
        if await until(exited, min(GRACE, deadline - loop.time())):
            return
        self._scan_tree(max_age=0)
        signal_group(proc.pid, signal.SIGTERM)
        if await until(exited, min(TERM_WAIT, deadline - loop.time())):
            return
        self._scan_tree(max_age=0)
        signal_group(proc.pid, signal.SIGKILL)
        if not await until(exited, min(KILL_WAIT, deadline - loop.time())):
            logger.warning("connector %s: pid %d survived SIGKILL; abandoning it", self.name, proc.pid)

    async def _abandon(self, proc: asyncio.subprocess.Process) -> None:
        signal_group(proc.pid, signal.SIGKILL)
        try:
            await until(lambda: proc.returncode is not None, KILL_WAIT, absorb_cancel=False)
        finally:
            self._orphanage.release(self._tag, leader_collected=proc.returncode is not None)
        close_subprocess_transport(proc)

    async def _monitor(self) -> None:
        """Notice the exit (even when a descendant holds the pipes) and record descendants meanwhile."""
        proc = self._proc
        if proc is None:  # no assert: the daemon runs with -OO
            raise ProcessStateError(f"connector {self.name!r} has not started")
        loop = asyncio.get_running_loop()
        next_scan = loop.time() + TREE_SCAN_INTERVAL
        while proc.returncode is None:
            await asyncio.sleep(_EXIT_POLL)
            if loop.time() >= next_scan:
                self._scan_tree(max_age=_TABLE_REUSE)
                next_scan = loop.time() + TREE_SCAN_INTERVAL
        self._request_stop(describe_exit(proc.returncode))

    def _spawn(self, coro: Coroutine[object, object, None], what: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"connector {self.name} {what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- descendants -----------------------------------------------------------------------------------------

    def snapshot_descendants(self) -> frozenset[int]:
        """Scan /proc now and record every descendant; returns the pids recorded and still alive.

        The monitor calls this every ``TREE_SCAN_INTERVAL`` and ``stop()`` at every step; a supervisor may
        call it more often (say, after each tool call) to narrow the double-fork window.
        """
        self._scan_tree(max_age=0)
        return self._tree.recorded if self._proc is not None else frozenset()

    def _scan_tree(self, *, max_age: float) -> None:
        if self._proc is not None:
            self._tree.scan(max_age=max_age, leader_running=self._proc.returncode is None)

    # -- pipes -----------------------------------------------------------------------------------------------

    def transport(self) -> Transport:
        """The (read, write) streams of ``SessionMessage`` for ``mcp.Client``/``ClientSession``; enter once.

        Leaving it detaches the session; the process lives until ``stop()``. Entered after the process ended,
        it yields a read stream already at EOF, so the client fails at once.
        """
        if self._proc is None:
            raise ProcessStateError(f"connector {self.name!r}: transport() needs a started process")
        if self._attached:
            raise ProcessStateError(f"connector {self.name!r}: transport() serves one session and was taken")
        self._attached = True
        if self._proc.stdin is None:  # spawned with pipes; no assert under -OO
            raise ProcessStateError(f"connector {self.name!r}: started without stdin")
        return self._framing.session_streams(self._proc.stdin, lambda writer: self._spawn(writer, "stdin"))

    @property
    def lane(self) -> RawLane | None:
        """Requests sent raw beside the session (``lane.RawLane``), once ``transport()`` has been entered."""
        return self._framing.lane if self._proc is not None else None


# -- helpers -----------------------------------------------------------------------------------------------------
