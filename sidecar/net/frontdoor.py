"""The front door: who may open a TCP connection at all, decided at accept (contract §3, issue 21 item 1).

The HTTP layer calls ``FrontDoor.admit`` once per accepted connection, in ``connection_made``, before a
byte is read. It answers a release callback (call it when the connection ends) or ``None``, in which
case the connection has already been reset: nothing was parsed, nothing was answered, no handler task
exists. Two rules, in order:

1. **The peer's account.** A loopback port is open to every account on the machine, so the kernel is
   asked which uid owns the *other* end (``sidecar.net.peer``). Another uid is refused. So is a peer the
   kernel cannot name (it reset or closed its end before we asked, or the query failed): "cannot tell"
   is never "allowed" (SECURITY). A client of the user's own that waits for its answer is always named:
   its socket is open while it waits. Where the platform cannot say at all (not Linux, or no
   socket-diagnostics netlink), the check is off and says so — at start, in ``sidecar status`` and in
   the README — rather than pretend.
2. **Open connections per uid** (``[limits] connections_per_uid``): one account (in practice the user's,
   since others never get past rule 1) cannot hold every descriptor of the daemon. Where the account
   cannot be learned, every connection counts against that one cap.

Refusals are counted (``sidecar status``) and audited **in aggregate**: a flood of connections writes
one ``peer.refused`` record per uid per minute with its count, and one log line per uid per minute,
never one per connection (contract §10: a request refused before its credential is known writes no
per-request record).

**Out of descriptors at accept** (``EMFILE``/``ENFILE``): asyncio's selector loop stops reading the
listening socket and tries again a second later (``ACCEPT_RETRY_DELAY``), so the daemon neither spins
nor fails; pending connections wait in the kernel's backlog. ``watching_accept`` turns the loop's
traceback for that into one line of ours per minute, naming the remedy, and counts the pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol, cast

from sidecar.store.tally import AuditAppend, AuditTally

__all__ = [
    "ACCEPT_PAUSED",
    "ANOTHER_ACCOUNT",
    "OVER_CAP",
    "OWNER_UNKNOWN",
    "REFUSED_EVENT",
    "AuditAppend",
    "FrontDoor",
    "OwnerLookup",
]

logger = logging.getLogger(__name__)

REFUSED_EVENT: Final = "peer.refused"
"""The aggregate audit record: ``uid`` (``null`` when unknown), ``count``, ``reasons``, ``since``."""
ANOTHER_ACCOUNT: Final = "another_account"
OWNER_UNKNOWN: Final = "owner_unknown"
OVER_CAP: Final = "over_cap"
ACCEPT_PAUSED: Final = "socket.accept() out of system resource"
"""The message asyncio's selector loop reports when ``accept`` fails for lack of resources (``selector_events``)."""
WINDOW: Final = 60.0
"""Seconds over which refusals of one uid make one audit record and one log line."""
_RESET: Final = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: close sends a reset and keeps no TIME_WAIT on our side (a flood leaves nothing)."""
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})


class OwnerLookup(Protocol):
    """The kernel's answer (``sidecar.net.peer.PeerOwners``); a test swaps it."""

    available: bool
    reason: str

    def owner(self, family: int, *, local: tuple[str, int], peer: tuple[str, int]) -> int | None: ...

    def close(self) -> None: ...


class FrontDoor:
    """Admits or refuses each accepted connection; counts and audits the refusals in aggregate."""

    def __init__(
        self,
        *,
        owners: OwnerLookup,
        per_uid: int,
        audit: AuditAppend,
        uid: int | None = None,
        window: float = WINDOW,
    ) -> None:
        if per_uid < 1:
            raise ValueError("per_uid must be at least 1")
        self._owners = owners
        self._per_uid = per_uid
        self._uid = os.getuid() if uid is None else uid
        self._window = window
        self._open: Counter[int | None] = Counter()
        self._refusals = AuditTally(audit, REFUSED_EVENT, key_name="uid", window=window)
        self._pause_logged_at: float | None = None
        self.refused = self._refusals.total
        """Connections refused since start, by reason (``sidecar status``)."""
        self.accept_pauses = 0
        """Times accepting paused because the daemon or the system was out of descriptors."""

    @property
    def checking(self) -> bool:
        """Whether the peer's account is checked at accept (false where the platform cannot tell)."""
        return self._owners.available

    def describe(self) -> dict[str, Any]:
        """What ``sidecar status`` shows under ``peer_check``."""
        return {
            "checked": self.checking,
            "reason": "" if self.checking else self._owners.reason,
            "connections_per_uid": self._per_uid,
            "open": sum(self._open.values()),
            "refused": sum(self.refused.values()),
            "refused_by_reason": dict(sorted(self.refused.items())),
            "accept_pauses": self.accept_pauses,
        }

    # -- accept --------------------------------------------------------------------------------------

    def admit(self, transport: asyncio.BaseTransport) -> Callable[[], None] | None:
        """The connection's release callback if it may stay; ``None`` once it has been reset."""
        uid: int | None = None
        if self.checking:
            uid = self._owner(transport)
            if uid != self._uid:
                # SECURITY: another account, or one the kernel cannot name, gets nothing: not a byte read.
                self._refuse(transport, uid, ANOTHER_ACCOUNT if uid is not None else OWNER_UNKNOWN)
                return None
        if self._open[uid] >= self._per_uid:
            self._refuse(transport, uid, OVER_CAP)
            return None
        self._open[uid] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._open[uid] -= 1
                if self._open[uid] <= 0:
                    del self._open[uid]

        return release

    def _owner(self, transport: asyncio.BaseTransport) -> int | None:
        sock = transport.get_extra_info("socket")
        local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        if sock is None or not isinstance(local, tuple) or not isinstance(peer, tuple):
            return None
        return self._owners.owner(sock.family, local=(local[0], local[1]), peer=(peer[0], peer[1]))

    def _refuse(self, transport: asyncio.BaseTransport, uid: int | None, reason: str) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        cast(asyncio.Transport, transport).abort()
        if self._refusals.count(uid, reason):
            self._log_first(uid, reason)

    def _log_first(self, uid: int | None, reason: str) -> None:
        """One line per uid per window: why, and what to do; the rest are counted."""
        later = f"more from it within {self._window:g}s are counted and audited once"
        if reason == ANOTHER_ACCOUNT:
            logger.warning(
                "refused a connection from uid %s, not this daemon's user (uid %s); %s", uid, self._uid, later
            )
        elif reason == OWNER_UNKNOWN:
            logger.warning(
                "refused a connection whose owner the kernel could not name (closed or reset before it was "
                "accepted); %s",
                later,
            )
        else:
            logger.warning(
                "refused a connection from uid %s: it already has %d open (raise [limits] connections_per_uid "
                "if a client of yours needs more); %s",
                uid,
                self._per_uid,
                later,
            )

    def flush(self) -> None:
        """Write one ``peer.refused`` record per uid refused since the last flush."""
        self._refusals.flush()

    def close(self) -> None:
        """Audit what is pending and stop the timer (the daemon stops; the audit log closes after this)."""
        self._refusals.close()
        self._owners.close()

    # -- out of descriptors at accept ----------------------------------------------------------------

    @contextlib.contextmanager
    def watching_accept(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """While inside: the loop's report that ``accept`` ran out of descriptors is counted and logged
        once a minute by us; every other report goes where it went before."""
        previous = loop.get_exception_handler()

        def handler(the_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if context.get("message") == ACCEPT_PAUSED and isinstance(exc, OSError):
                self._accept_paused(exc)
            elif previous is not None:
                previous(the_loop, context)
            else:
                the_loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        try:
            yield
        finally:
            loop.set_exception_handler(previous)

    def _accept_paused(self, exc: OSError) -> None:
        self.accept_pauses += 1
        now = time.monotonic()
        if self._pause_logged_at is not None and now - self._pause_logged_at < self._window:
            return
        self._pause_logged_at = now
        if exc.errno in _OUT_OF_DESCRIPTORS:
            what = "this process" if exc.errno == errno.EMFILE else "the system"
            remedy = (
                f"{what} is out of file descriptors; raise the hard limit (ulimit -Hn, LimitNOFILE= in the "
                "service unit) or lower [limits] connections_per_uid"
            )
        else:
            remedy = f"the system is short of memory for sockets ({exc.strerror})"
        logger.warning(
            "cannot accept connections: %s; accepting pauses for a second and resumes (waiting clients stay "
            "queued); %d pauses so far",
            remedy,
            self.accept_pauses,
        )
