"""One connector subprocess: newline-delimited JSON-RPC on stdio, supervised so that nothing outlives it.

``ConnectorProcess`` spawns a connector exactly as configured (argv, no shell; the caller's env, nothing
merged in; its own session and process group), hands the MCP client a transport over its pipes, and
reports how it ended. The contract the tests hold:

* **Nothing leaks.** ``stop()`` escalates: close stdin → ``GRACE`` → SIGTERM the group → ``TERM_WAIT`` →
  SIGKILL the group → ``KILL_WAIT``; then it always SIGKILLs the group once more (children left behind by a
  leader that exited cleanly) and every recorded descendant that escaped the group (``setsid``,
  double-fork). A crash runs the same clean-up. ``stop()`` returns within ``STOP_BOUND`` seconds.
* **Escapees are recorded while they are still reachable.** A descendant that calls ``setsid`` is out of
  reach of ``killpg``, and once its parent dies nothing links it to the connector. So the descendant tree is
  read from ``/proc`` every ``TREE_SCAN_INTERVAL`` seconds and at every escalation step; each descendant is
  recorded as (pid, start time) and killed at the end only if that pair still matches (no pid reuse). Linux
  only; elsewhere only the process group is killed. What a double-fork hides between two scans can only be
  caught with cgroups (or a subreaper, which is process-wide).
* **A misbehaving connector fails alone.** A stdout line over ``max_line_bytes`` stops that connector
  (``exit_reason`` says why); a non-JSON line is logged and skipped. stdout EOF or process exit closes the
  read stream, so the client's pending calls fail at once (the SDK raises ``MCPError(CONNECTION_CLOSED)``).
* **A stop cannot be cut short.** ``stop()`` shields the one shutdown task, which absorbs cancels (its waits
  are bounded) so that event-loop teardown still sees it through; a shutdown cancelled before its first
  step kills the tree synchronously from its done-callback.
* stderr is drained continuously into a bounded tail; the child never blocks on it.

State: ``starting → running → stopping → exited`` (or ``starting → exited`` when the spawn fails or is
stopped); anything else raises ``ProcessStateError`` naming both states.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.client import Transport
from mcp.shared.message import SessionMessage

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
"""Seconds between /proc scans for descendants: a scan costs ~30 µs per process (2-core VM), shared by all
connectors (``_TABLE_REUSE``), so the period trades CPU against the double-fork window."""

_EXIT_POLL: Final = 0.1
"""Seconds between returncode checks while running: a crash whose pipes a descendant holds is noticed this late."""
_STOP_POLL: Final = 0.01
"""Seconds between checks while stopping (the SDK polls at the same rate)."""
_TREE_GONE_WAIT: Final = 0.5
"""Seconds for SIGKILLed group members and escapees to die after the final kill."""
_DRAIN_WAIT: Final = 0.2
"""Seconds to read what the dead tree left in stdout/stderr before the pipes are closed."""
_WRITER_FLUSH: Final = 0.5
"""Seconds for messages the client already sent to reach stdin when the transport closes (as the SDK)."""
_TABLE_REUSE: Final = 0.5
"""Seconds a periodic /proc snapshot serves other connectors, so N connectors do not mean N scans."""
_MAX_TRACKED: Final = 1024
"""Descendants recorded per connector; a connector forking past this is beyond what pid tracking can hold."""
_STDERR_LINE_BYTES: Final = 4096
"""Longest stderr line kept in the tail (longer ones are cut), so the tail stays small."""
_CHUNK: Final = 65536
"""Bytes per read when draining stderr, or stdout after an over-long line."""
_DEAD_STATES: Final = frozenset({"Z", "X"})

_Inbound = SessionMessage | Exception
"""What the read stream carries (the SDK's TransportStreams); this transport never sends an Exception."""


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
    """stderr lines kept for ``connectors show``."""
    start_timeout: float = 30.0
    """Seconds the spawn may take here; the supervisor bounds the MCP handshake with the same value."""

    def __post_init__(self) -> None:
        for field in ("max_line_bytes", "stderr_lines", "start_timeout"):
            if not getattr(self, field) > 0:
                raise ValueError(f"ProcessLimits.{field} must be positive, got {getattr(self, field)!r}")


class ConnectorProcess:
    """One connector subprocess speaking newline-delimited JSON-RPC on stdio, with supervision hooks."""

    # Created with the process: stdout lines in, the session's read stream out.
    _inbound_send: MemoryObjectSendStream[_Inbound]
    _inbound_recv: MemoryObjectReceiveStream[_Inbound]

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        limits: ProcessLimits = ProcessLimits(),
        name: str = "",
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
        self._leader_start: int | None = None
        self._exit_reason: str | None = None
        self._stderr: deque[str] = deque(maxlen=limits.stderr_lines)
        self._stderr_grew = asyncio.Event()
        self._stderr_done = False
        self._tracked: dict[int, int] = {}  # pid -> start time of every descendant seen
        self._attached = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._shutdown: asyncio.Task[None] | None = None
        self._bad_lines = 0

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
    def stderr_tail(self) -> list[str]:
        """The last ``stderr_lines`` lines of stderr (each cut at 4 KiB), oldest first."""
        return list(self._stderr)

    async def wait_for_stderr(self, predicate: Callable[[str], bool]) -> str | None:
        """The first tail line matching ``predicate``, waiting for more; None once stderr has closed.

        Unbounded by itself: callers wrap it in ``asyncio.timeout``.
        """
        while True:
            grew = self._stderr_grew
            for line in self._stderr:
                if predicate(line):
                    return line
            if self._stderr_done:
                return None
            await grew.wait()

    # -- lifecycle -------------------------------------------------------------------------------------------

    def _set_state(self, new: ProcessState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise ProcessStateError(f"connector {self.name!r}: illegal transition {self._state} -> {new}")
        self._state = new

    async def __aenter__(self) -> ConnectorProcess:
        if self._state is not ProcessState.STARTING or self._proc is not None:
            raise ProcessStateError(f"connector {self.name!r}: illegal transition {self._state} -> running")
        try:
            async with asyncio.timeout(self._limits.start_timeout):
                # SECURITY: argv as given, no shell; exactly the caller's (scrubbed) env; a new session so the
                # whole group can be signalled; no preexec_fn (unsafe with threads, ruff PLW1509).
                proc = await asyncio.create_subprocess_exec(
                    *self._argv,
                    env=self._env,
                    cwd=self._cwd,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    limit=self._limits.max_line_bytes,
                )
        except (OSError, ValueError, TimeoutError) as exc:
            self._exit_reason = f"failed to start: {type(exc).__name__}: {exc}"
            if self._state is ProcessState.STARTING:
                self._set_state(ProcessState.EXITED)
            self.exited.set()
            raise
        self._proc = proc
        if self._state is not ProcessState.STARTING:  # stop() ran while we were spawning
            await self._abandon(proc)
            raise ProcessStateError(f"connector {self.name!r}: stopped while starting")
        leader = _read_stat(proc.pid)
        self._leader_start = leader.start if leader else None
        self._inbound_send, self._inbound_recv = anyio.create_memory_object_stream[_Inbound](0)
        self._set_state(ProcessState.RUNNING)
        logger.info("connector %s started: pid %d", self.name, proc.pid)
        self._pump = self._spawn(self._pump_stdout(), "stdout")
        self._stderr_task = self._spawn(self._drain_stderr(), "stderr")
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
            self._exit_reason = "stopped"
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
            rc = self.returncode
            self._exit_reason = reason or (_describe_exit(rc) if rc is not None else "stopped")
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
        _signal_group(self._proc.pid, signal.SIGKILL)
        self._kill_tracked()
        try:
            self._release(self._proc)
        finally:
            self._set_state(ProcessState.EXITED)
            self.exited.set()

    async def _run_shutdown(self) -> None:
        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_BOUND - 0.2
        try:
            await self._escalate(proc, deadline)
            # Always: same-group leftovers of a leader that exited on its own, then recorded escapees.
            self._scan_tree(max_age=0)
            _signal_group(proc.pid, signal.SIGKILL)
            self._kill_tracked()
            if not await _until(lambda: not self._tree_alive(), min(_TREE_GONE_WAIT, deadline - loop.time())):
                logger.warning("connector %s: processes of its tree survived SIGKILL", self.name)
            readers = [t for t in (self._pump, self._stderr_task) if t is not None]
            await _until(lambda: all(t.done() for t in readers), min(_DRAIN_WAIT, deadline - loop.time()))
        except Exception:
            logger.exception("connector %s: stopping failed; closing its pipes anyway", self.name)
        finally:
            try:
                self._release(proc)
            except Exception:
                logger.exception("connector %s: releasing its pipes failed", self.name)
            finally:
                self._set_state(ProcessState.EXITED)
                self.exited.set()
                logger.info(
                    "connector %s (pid %d): %s; returncode %s", self.name, proc.pid, self._exit_reason, proc.returncode
                )

    def _release(self, proc: asyncio.subprocess.Process) -> None:
        """End the session's read side, close our pipe ends and cancel the helper tasks."""
        self._inbound_send.close()
        if not self._attached:  # otherwise the session owns (and closes) the read stream
            self._inbound_recv.close()
        _close_stdin(proc)
        _close_subprocess_transport(proc)
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def _escalate(self, proc: asyncio.subprocess.Process, deadline: float) -> None:
        loop = asyncio.get_running_loop()

        def exited() -> bool:
            return proc.returncode is not None

        self._scan_tree(max_age=0)
        _close_stdin(proc, graceful=True)
        if await _until(exited, min(GRACE, deadline - loop.time())):
            return
        self._scan_tree(max_age=0)
        _signal_group(proc.pid, signal.SIGTERM)
        if await _until(exited, min(TERM_WAIT, deadline - loop.time())):
            return
        self._scan_tree(max_age=0)
        _signal_group(proc.pid, signal.SIGKILL)
        if not await _until(exited, min(KILL_WAIT, deadline - loop.time())):
            logger.warning("connector %s: pid %d survived SIGKILL; abandoning it", self.name, proc.pid)

    async def _abandon(self, proc: asyncio.subprocess.Process) -> None:
        _signal_group(proc.pid, signal.SIGKILL)
        await _until(lambda: proc.returncode is not None, KILL_WAIT, absorb_cancel=False)
        _close_subprocess_transport(proc)

    async def _monitor(self) -> None:
        """Notice the exit (even when a descendant holds the pipes) and record descendants meanwhile."""
        proc = self._proc
        assert proc is not None
        loop = asyncio.get_running_loop()
        next_scan = loop.time() + TREE_SCAN_INTERVAL
        while proc.returncode is None:
            await asyncio.sleep(_EXIT_POLL)
            if loop.time() >= next_scan:
                self._scan_tree(max_age=_TABLE_REUSE)
                next_scan = loop.time() + TREE_SCAN_INTERVAL
        self._request_stop(_describe_exit(proc.returncode))

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
        return frozenset(self._tracked)

    def _scan_tree(self, *, max_age: float) -> None:
        table = _PROC_TABLE.get(max_age)
        proc = self._proc
        if table is None or proc is None:
            return
        me = proc.pid
        self._tracked = {
            pid: start
            for pid, start in self._tracked.items()
            if (row := table.get(pid)) is not None and row.start == start and row.state not in _DEAD_STATES
        }
        leader = table.get(me)
        roots = list(self._tracked)
        if proc.returncode is None and leader is not None and leader.start == self._leader_start:
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
            if row is None or row.state in _DEAD_STATES or pid in self._tracked:
                continue
            if len(self._tracked) >= _MAX_TRACKED:
                logger.warning("connector %s: over %d descendants; not recording more", self.name, _MAX_TRACKED)
                break
            self._tracked[pid] = row.start

    def _kill_tracked(self) -> None:
        for pid, start in self._tracked.items():
            row = _read_stat(pid)
            if row is None or row.start != start or row.state in _DEAD_STATES:
                continue  # gone, or the pid now names another process
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            if row.pgrp == pid:  # it leads its own group (setsid): take the members we never saw too
                _signal_group(pid, signal.SIGKILL)

    def _tree_alive(self) -> bool:
        proc = self._proc
        assert proc is not None
        table = _PROC_TABLE.get(0)
        if table is None:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass  # EPERM never proves the group is gone
            return True
        return any(
            row.state not in _DEAD_STATES and (row.pgrp == proc.pid or self._tracked.get(row.pid) == row.start)
            for row in table.values()
        )

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
        return self._transport(self._proc)

    @contextlib.asynccontextmanager
    async def _transport(
        self, proc: asyncio.subprocess.Process
    ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[_Inbound], MemoryObjectSendStream[SessionMessage]]]:
        out_send, out_recv = anyio.create_memory_object_stream[SessionMessage](0)
        writer = self._spawn(self._write_stdin(proc, out_recv), "stdin")
        try:
            yield self._inbound_recv, out_send
        finally:
            out_send.close()
            await asyncio.wait({writer}, timeout=_WRITER_FLUSH)
            writer.cancel()
            out_recv.close()
            self._inbound_recv.close()

    async def _write_stdin(
        self, proc: asyncio.subprocess.Process, outbound: MemoryObjectReceiveStream[SessionMessage]
    ) -> None:
        assert proc.stdin is not None
        try:
            with outbound:
                async for message in outbound:
                    # One write per message: a pipe write is a system call.
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    proc.stdin.write(line)
                    await proc.stdin.drain()
        except OSError:  # BrokenPipe/ConnectionReset: the connector closed stdin or died
            logger.info("connector %s: stdin closed; ending the session", self.name)
            self._inbound_send.close()  # as the SDK does: a request must not wait for a reply that cannot come

    async def _pump_stdout(self) -> None:
        """Deliver one JSON-RPC message per stdout line; an over-long line stops this connector, nothing else."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        overflow = False
        try:
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError:  # asyncio's LimitOverrunError, raised by readline() as ValueError
                    overflow = True
                    self._request_stop(f"line over {self._limits.max_line_bytes} bytes")
                    break
                except OSError:
                    break
                if not line:
                    break
                message = self._parse(line)
                if message is None:
                    continue
                # If the session is gone, keep reading anyway so the connector never blocks on a full pipe.
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await self._inbound_send.send(message)
        finally:
            self._inbound_send.close()  # EOF for the session: pending calls fail now
        if overflow:  # drain and discard, so a connector blocked mid-flood can see stdin close and exit
            with contextlib.suppress(OSError):
                while await proc.stdout.read(_CHUNK):
                    pass

    def _parse(self, line: bytes) -> SessionMessage | None:
        if not line.strip():
            return None
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # pydantic's ValidationError; its text quotes the input, so it is not logged
            self._bad_lines += 1
            log = logger.warning if self._bad_lines == 1 else logger.debug
            log(
                "connector %s wrote a stdout line that is not JSON-RPC (%d bytes, %s); skipped (%d so far)",
                self.name,
                len(line),
                type(exc).__name__,
                self._bad_lines,
            )
            return None

    async def _drain_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        partial = bytearray()
        skipping = False  # inside a line already cut at _STDERR_LINE_BYTES
        try:
            while chunk := await proc.stderr.read(_CHUNK):
                start = 0
                while (newline := chunk.find(b"\n", start)) >= 0:
                    if not skipping:
                        partial += chunk[start:newline]
                        self._add_stderr(partial)
                    partial.clear()
                    skipping = False
                    start = newline + 1
                if not skipping:
                    partial += chunk[start:]
                    if len(partial) > _STDERR_LINE_BYTES:
                        self._add_stderr(partial)
                        partial.clear()
                        skipping = True
            if partial and not skipping:
                self._add_stderr(partial)
        except OSError:
            pass
        finally:
            self._stderr_done = True
            self._wake_stderr_waiters()

    def _add_stderr(self, raw: bytearray) -> None:
        text = bytes(raw[:_STDERR_LINE_BYTES]).decode("utf-8", "replace").rstrip("\r")
        self._stderr.append(text + (" [cut]" if len(raw) > _STDERR_LINE_BYTES else ""))
        self._wake_stderr_waiters()

    def _wake_stderr_waiters(self) -> None:
        grew, self._stderr_grew = self._stderr_grew, asyncio.Event()
        grew.set()


# -- helpers -----------------------------------------------------------------------------------------------------


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    # ESRCH: the group is gone. EPERM: we signalled what we may (macOS answers EPERM for zombies).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


async def _until(condition: Callable[[], bool], seconds: float, *, absorb_cancel: bool = True) -> bool:
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
            await asyncio.sleep(_STOP_POLL)
        except asyncio.CancelledError:
            if not absorb_cancel:
                raise
            logger.debug("cancel during a connector stop absorbed; the stop is bounded and finishes first")
    return True


def _close_stdin(proc: asyncio.subprocess.Process, *, graceful: bool = False) -> None:
    """Close the connector's stdin: gracefully (after buffered writes) to ask it to exit, or abort at the end."""
    if proc.stdin is None or proc.stdin.transport.is_closing():
        return
    with contextlib.suppress(OSError, RuntimeError):
        if graceful:
            proc.stdin.close()
        else:
            proc.stdin.transport.abort()


def _close_subprocess_transport(proc: asyncio.subprocess.Process) -> None:
    """Close asyncio's subprocess transport, which otherwise stays open while a survivor holds a pipe.

    Nothing public exposes it (the SDK's stdio client does the same attribute walk).
    """
    transport = getattr(proc, "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(PermissionError):
            close()


# -- /proc -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Stat:
    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str
    start: int
    """Start time in clock ticks since boot: with the pid, it names one process across pid reuse."""


def _read_stat(pid: int) -> _Stat | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # proc(5): "pid (comm) state ppid pgrp session ..."; comm may hold spaces and ')', so split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return _Stat(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode("ascii"), int(fields[19]))
    except (IndexError, ValueError):
        return None


class _ProcTable:
    """A snapshot of every process's stat line, shared by all connectors for a short while."""

    def __init__(self) -> None:
        self._available = sys.platform == "linux" and os.path.isdir("/proc/self")
        self._taken = -math.inf
        self._rows: dict[int, _Stat] = {}

    def get(self, max_age: float) -> dict[int, _Stat] | None:
        """The table, rescanned if older than ``max_age`` seconds; None without /proc (macOS, BSD)."""
        if not self._available:
            return None
        now = time.monotonic()
        if now - self._taken >= max_age:
            rows = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit() and (row := _read_stat(int(entry))) is not None:
                    rows[row.pid] = row
            self._rows, self._taken = rows, now
        return self._rows


_PROC_TABLE: Final = _ProcTable()
