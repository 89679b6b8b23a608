"""The front door decides at accept (``sidecar.net.frontdoor``): real loopback connections, a swapped owner lookup.

The kernel's answer is faked at the ``OwnerLookup`` seam (the real one, and a real other account, are in
``tests/unit/test_peer.py`` and ``tests/security/test_peer_account.py``); the sockets, the reset and the
event loop's accept are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pytest

from sidecar.net.frontdoor import ANOTHER_ACCOUNT, OVER_CAP, OWNER_UNKNOWN, REFUSED_EVENT, FrontDoor
from tests.helpers import wait_until

ME: Final = 1000
OTHER: Final = 65534
BOUND: Final = 10.0  # seconds for any one exchange on loopback
REQUEST: Final = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@dataclass
class Owners:
    """The kernel's answer, as the test wants it."""

    uid: int | None
    available: bool = True
    reason: str = ""
    asked: int = 0

    def owner(self, family: int, *, local: tuple[str, int], peer: tuple[str, int]) -> int | None:
        assert family == socket.AF_INET and local[0] == peer[0] == "127.0.0.1"
        self.asked += 1
        return self.uid

    def close(self) -> None:
        pass


@dataclass
class Audit:
    records: list[dict[str, Any]] = field(default_factory=list)
    written: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: str, /, **fields: Any) -> None:
        self.records.append({"event": event, **fields})
        self.written.set()


@dataclass
class Served:
    """What the server behind the door saw: admitted connections and the bytes they sent."""

    port: int
    admitted: int = 0
    received: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def behind(door: FrontDoor) -> AsyncIterator[Served]:
    """A TCP server on 127.0.0.1:0 that asks ``door`` in ``connection_made``, as ``sidecar.http`` does."""
    loop = asyncio.get_running_loop()
    served = Served(port=0)

    class Protocol(asyncio.Protocol):
        release: Callable[[], None] | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.release = door.admit(transport)
            if self.release is not None:
                served.admitted += 1

        def data_received(self, data: bytes) -> None:
            served.received.append(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.release is not None:
                self.release()

    server = await loop.create_server(Protocol, "127.0.0.1", 0)
    served.port = server.sockets[0].getsockname()[1]
    try:
        yield served
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), BOUND)


async def answer(port: int) -> bytes:
    """Connect, send a request, and read until the server closes: what came back (nothing when reset)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), BOUND)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(REQUEST)
            await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(), BOUND)
        except ConnectionResetError:
            return b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_another_accounts_connections_are_reset_unread_and_audited_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    audit = Audit()
    door = FrontDoor(owners=Owners(OTHER), per_uid=8, audit=audit, uid=ME)
    with caplog.at_level(logging.WARNING, logger="sidecar.net.frontdoor"):
        async with behind(door) as served:
            answers = [await answer(served.port) for _ in range(20)]
    assert answers == [b""] * 20
    assert served.admitted == 0 and served.received == []  # nothing read, nothing parsed
    assert door.refused == {ANOTHER_ACCOUNT: 20}
    assert audit.records == []  # nothing per connection
    assert caplog.text.count("refused a connection from uid 65534") == 1

    door.close()
    assert audit.records == [
        {
            "event": REFUSED_EVENT,
            "uid": OTHER,
            "count": 20,
            "reasons": {ANOTHER_ACCOUNT: 20},
            "since": audit.records[0]["since"],
        }
    ]
    door.flush()
    assert len(audit.records) == 1


async def test_a_peer_the_kernel_cannot_name_is_refused() -> None:
    audit = Audit()
    door = FrontDoor(owners=Owners(None), per_uid=8, audit=audit, uid=ME)
    async with behind(door) as served:
        assert await answer(served.port) == b""
    assert served.admitted == 0 and door.refused == {OWNER_UNKNOWN: 1}
    door.close()
    assert [(r["uid"], r["count"], r["reasons"]) for r in audit.records] == [(None, 1, {OWNER_UNKNOWN: 1})]


async def test_the_users_own_connections_are_served() -> None:
    owners = Owners(ME)
    door = FrontDoor(owners=owners, per_uid=8, audit=Audit(), uid=ME)
    async with behind(door) as served:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", served.port), BOUND)
        writer.write(REQUEST)
        await writer.drain()
        await wait_until(lambda: b"".join(served.received) == REQUEST, timeout=BOUND)
        writer.close()
    assert served.admitted == 1 and owners.asked == 1 and not door.refused


async def test_one_account_holds_at_most_its_cap_of_open_connections() -> None:
    audit = Audit()
    door = FrontDoor(owners=Owners(ME), per_uid=4, audit=audit, uid=ME)
    async with behind(door) as served:
        held = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(4)]
        await wait_until(lambda: served.admitted == 4, timeout=BOUND)
        assert await answer(served.port) == b""
        assert door.refused == {OVER_CAP: 1} and door.describe()["open"] == 4

        held.pop()[1].close()  # one place frees when the daemon sees that connection end
        await wait_until(lambda: door.describe()["open"] == 3, timeout=BOUND)
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        await wait_until(lambda: served.admitted == 5, timeout=BOUND)
        for _, w in [*held, (reader, writer)]:
            w.close()
        await wait_until(lambda: door.describe()["open"] == 0, timeout=BOUND)
    door.close()
    assert [(r["uid"], r["reasons"]) for r in audit.records] == [(ME, {OVER_CAP: 1})]


def test_a_release_counts_once() -> None:
    class Transport(asyncio.Transport):
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return default

    door = FrontDoor(owners=Owners(ME, available=False, reason="not here"), per_uid=4, audit=Audit(), uid=ME)
    release = door.admit(Transport())
    assert release is not None and door.describe()["open"] == 1
    release()
    release()
    assert door.describe()["open"] == 0


async def test_where_the_owner_cannot_be_learned_nothing_is_refused_for_it_and_status_says_so() -> None:
    owners = Owners(OTHER, available=False, reason="the peer's OS account cannot be learned on this platform")
    door = FrontDoor(owners=owners, per_uid=4, audit=Audit(), uid=ME)
    async with behind(door) as served:
        _reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        await wait_until(lambda: served.admitted == 1, timeout=BOUND)
        writer.close()
    assert owners.asked == 0 and not door.refused
    described = door.describe()
    assert described["checked"] is False and "cannot be learned" in described["reason"]


async def test_refusals_are_audited_when_their_window_ends() -> None:
    audit = Audit()
    door = FrontDoor(owners=Owners(OTHER), per_uid=4, audit=audit, uid=ME, window=0.05)
    async with behind(door) as served:
        assert await answer(served.port) == b""
        await asyncio.wait_for(audit.written.wait(), BOUND)  # the window's timer, not the stop, wrote it
    assert [(r["event"], r["uid"], r["count"]) for r in audit.records] == [(REFUSED_EVENT, OTHER, 1)]
    door.close()
    assert len(audit.records) == 1


async def test_out_of_descriptors_at_accept_pauses_accepting_then_resumes(caplog: pytest.LogCaptureFixture) -> None:
    """The seam: a listening socket whose ``accept`` fails with EMFILE twice, as a process out of
    descriptors sees it. The loop must stop asking (no spinning), say so once, and serve the waiting
    client once it may."""
    accepts: list[str] = []

    class Listener(socket.socket):
        def accept(self) -> tuple[socket.socket, Any]:
            if len(accepts) < 2:
                accepts.append("EMFILE")
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            accepts.append("ok")
            return super().accept()

    listener = Listener(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    loop = asyncio.get_running_loop()
    door = FrontDoor(owners=Owners(ME), per_uid=4, audit=Audit(), uid=ME)
    connected = asyncio.Event()

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if door.admit(transport) is not None:
                connected.set()

    with caplog.at_level(logging.WARNING), door.watching_accept(loop):
        server = await loop.create_server(Protocol, sock=listener)
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), BOUND)
            await asyncio.wait_for(connected.wait(), 3 * BOUND)  # asyncio retries a second after each pause
            writer.close()
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), BOUND)
    assert accepts[:3] == ["EMFILE", "EMFILE", "ok"]  # paused after each failure: no busy loop of accepts
    assert door.accept_pauses == 2
    assert caplog.text.count("cannot accept connections") == 1  # one line, not one per pause
    assert "out of file descriptors" in caplog.text and "Traceback" not in caplog.text


async def test_the_loops_other_reports_go_where_they_went() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context["message"]))
    try:
        door = FrontDoor(owners=Owners(ME), per_uid=4, audit=Audit(), uid=ME)
        with door.watching_accept(loop):
            loop.call_exception_handler({"message": "something else"})
        assert seen == ["something else"]
        assert loop.get_exception_handler() is not None
    finally:
        loop.set_exception_handler(previous)
