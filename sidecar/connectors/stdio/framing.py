"""A connector's stdio as MCP streams: newline-delimited JSON-RPC on stdin/stdout, stderr as a bounded tail.

The MCP stdio transport frames one JSON-RPC message per line, UTF-8, no embedded newlines. Everything a
connector writes is untrusted and bounded here:

* **stdout** (``StdioFraming.read_stdout``): one message per line, at most ``max_line_bytes`` (the
  ``StreamReader`` is created with that limit); a longer line is reported through ``on_overflow`` (the
  process stops that connector) and the rest of stdout is drained and dropped so a connector blocked
  mid-flood can still see stdin close. A line that is not JSON-RPC is logged (its length and the error
  type, never its text) and skipped. EOF closes the session's read stream, so pending calls fail at once.
* **stdin** (``StdioFraming.write_stdin``): one write per message; a broken pipe ends the session's read
  stream too, as the SDK does (a request must not wait for a reply that cannot come).
* **the raw lane** (``StdioFraming.lane``, ``lane.RawLane``): requests sent raw beside the session; each
  stdout line is offered to the lane first while it waits on any, and the rest go to the session.
* **stderr** (``StderrTail``): drained continuously (the child never blocks on it) into the last N lines,
  each cut at ``STDERR_LINE_BYTES``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.shared.message import SessionMessage

from sidecar.connectors.stdio.lane import RawLane

__all__ = ["STDERR_LINE_BYTES", "Inbound", "StderrTail", "StdioFraming"]

logger = logging.getLogger(__name__)

STDERR_LINE_BYTES: Final = 4096
"""Longest stderr line kept in the tail (longer ones are cut and marked ``[cut]``), so the tail stays small."""
_CHUNK: Final = 65536
"""Bytes per read when draining stderr, or stdout after an over-long line."""
_CATCH_UP_TURNS: Final = 64
"""Event-loop turns the lane waits at most for the session to take in what it was handed (a few suffice)."""
_WRITER_FLUSH: Final = 0.5
"""Seconds for messages the client already sent to reach stdin when the session leaves (as the SDK)."""

Inbound = SessionMessage | Exception
"""What the read stream carries (the SDK's TransportStreams); this transport never sends an Exception."""


class StdioFraming:
    """One connector's stdout and stdin as the (read, write) message streams of one MCP client session."""

    inbound: MemoryObjectReceiveStream[Inbound]
    """The session's read stream (stdout messages); whoever holds the session closes it."""
    _inbound_send: MemoryObjectSendStream[Inbound]

    def __init__(self, name: str, *, max_line_bytes: int) -> None:
        self.name = name
        self.max_line_bytes = max_line_bytes
        self._inbound_send, self.inbound = anyio.create_memory_object_stream[Inbound](0)
        self._bad_lines = 0
        self.lane: RawLane | None = None
        """Requests sent raw on the session's stdin (``session_streams`` opens it)."""

    @contextlib.asynccontextmanager
    async def session_streams(
        self, stdin: asyncio.StreamWriter, spawn: Callable[[Coroutine[object, object, None]], asyncio.Task[None]]
    ) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Inbound], MemoryObjectSendStream[SessionMessage]]]:
        """The session's (read, write) streams; the stdin writer runs in a task made by ``spawn``.

        Leaving flushes what the session already sent (for up to ``_WRITER_FLUSH`` seconds) and closes both.
        """
        out_send, out_recv = anyio.create_memory_object_stream[SessionMessage](0)
        writer = spawn(self.write_stdin(stdin, out_recv))
        self.lane = RawLane(self.name, stdin)
        try:
            yield self.inbound, out_send
        finally:
            self.lane.close()
            out_send.close()
            await asyncio.wait({writer}, timeout=_WRITER_FLUSH)
            writer.cancel()
            out_recv.close()
            self.inbound.close()

    def end_inbound(self) -> None:
        """EOF for the session: its pending calls fail now (the SDK raises ``CONNECTION_CLOSED``), the
        lane's too."""
        self._inbound_send.close()
        if self.lane is not None:
            self.lane.close()

    async def read_stdout(self, stdout: asyncio.StreamReader, *, on_overflow: Callable[[str], object]) -> None:
        """Deliver one JSON-RPC message per stdout line until EOF; an over-long line calls ``on_overflow``
        with the reason and ends the reading (stdout is then drained and dropped)."""
        overflow = False
        handed = False  # a message went to the session since the lane last took one
        try:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:  # asyncio's LimitOverrunError, raised by readline() as ValueError
                    overflow = True
                    on_overflow(f"line over {self.max_line_bytes} bytes")
                    break
                except OSError:
                    break
                if not line:
                    break
                lane = self.lane
                taken = lane.claim(line) if lane is not None and lane.waiting else None
                if lane is not None and taken is not None:
                    if handed:
                        await self._session_caught_up()
                        handed = False
                    lane.take(taken)
                    continue
                message = self._parse(line)
                if message is None:
                    continue
                # If the session is gone, keep reading anyway so the connector never blocks on a full pipe.
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await self._inbound_send.send(message)
                    handed = True
        finally:
            self.end_inbound()
        if overflow:  # drain and discard, so a connector blocked mid-flood can see stdin close and exit
            with contextlib.suppress(OSError):
                while await stdout.read(_CHUNK):
                    pass

    async def _session_caught_up(self) -> None:
        """Let the session take in what it was handed before the lane wakes anyone, so the connector's order
        holds: a log line or a sampling request written before a response reaches the client first.

        The session's dispatcher spawns a task for each notification or request it reads, and a waiter it
        wakes runs after those (the event loop runs ready tasks in order); the lane keeps the same order by
        waking its waiter only once the dispatcher is back waiting for the next message. Bounded: a
        dispatcher held up in a handler of its own does not hold the lane up for long.
        """
        for _ in range(_CATCH_UP_TURNS):
            stats = self._inbound_send.statistics()
            if stats.tasks_waiting_receive or not stats.open_receive_streams:
                return
            await asyncio.sleep(0)  # one turn of the event loop

    async def write_stdin(
        self, stdin: asyncio.StreamWriter, outbound: MemoryObjectReceiveStream[SessionMessage]
    ) -> None:
        """Write each message the session sends as one line, until ``outbound`` closes or the pipe breaks."""
        try:
            with outbound:
                async for message in outbound:
                    # One write per message: a pipe write is a system call.
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                    stdin.write(line)
                    await stdin.drain()
        except OSError:  # BrokenPipe/ConnectionReset: the connector closed stdin or died
            logger.info("connector %s: stdin closed; ending the session", self.name)
            self.end_inbound()  # as the SDK does: a request must not wait for a reply that cannot come

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


class StderrTail:
    """The last ``size`` lines a connector wrote to stderr (each cut at ``STDERR_LINE_BYTES``), oldest first."""

    def __init__(self, size: int) -> None:
        self._lines: deque[str] = deque(maxlen=size)
        self._grew = asyncio.Event()
        self._done = False

    @property
    def lines(self) -> list[str]:
        return list(self._lines)

    async def wait_for(self, predicate: Callable[[str], bool]) -> str | None:
        """The first tail line matching ``predicate``, waiting for more; None once stderr has closed.

        Unbounded by itself: callers wrap it in ``asyncio.timeout``.
        """
        while True:
            grew = self._grew
            for line in self._lines:
                if predicate(line):
                    return line
            if self._done:
                return None
            await grew.wait()

    async def drain(self, stderr: asyncio.StreamReader) -> None:
        """Read stderr to EOF, keeping the tail; never holds more than one cut line in memory."""
        partial = bytearray()
        skipping = False  # inside a line already cut at STDERR_LINE_BYTES
        try:
            while chunk := await stderr.read(_CHUNK):
                start = 0
                while (newline := chunk.find(b"\n", start)) >= 0:
                    if not skipping:
                        partial += chunk[start:newline]
                        self._add(partial)
                    partial.clear()
                    skipping = False
                    start = newline + 1
                if not skipping:
                    partial += chunk[start:]
                    if len(partial) > STDERR_LINE_BYTES:
                        self._add(partial)
                        partial.clear()
                        skipping = True
            if partial and not skipping:
                self._add(partial)
        except OSError:
            pass
        finally:
            self._done = True
            self._wake()

    def _add(self, raw: bytearray) -> None:
        text = bytes(raw[:STDERR_LINE_BYTES]).decode("utf-8", "replace").rstrip("\r")
        self._lines.append(text + (" [cut]" if len(raw) > STDERR_LINE_BYTES else ""))
        self._wake()

    def _wake(self) -> None:
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()
