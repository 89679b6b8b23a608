"""Who is on the other end of a loopback TCP connection: the uid that owns the peer's socket.

A loopback port is open to every account on the machine. The daemon serves one user, so at accept it
asks the kernel which uid owns the *other* end of the connection and closes it before reading a byte
when that is not its own uid (contract §3). The answer comes from the kernel, not from anything the
peer sends, so it cannot be forged by the peer.

Linux: one ``SOCK_DIAG_BY_FAMILY`` request over ``NETLINK_SOCK_DIAG`` with the connection's exact
4-tuple (``inet_diag_req_v2``, no dump flag). The kernel answers it with a hash lookup of the one socket,
so its cost does not grow with the number of sockets on the machine (``/proc/net/tcp`` would be a scan of
them all, at every accept). No library does this single exact lookup without pulling a whole netlink
stack (pyroute2 dumps tables), so it is the two structs below.

Elsewhere, or where the kernel refuses the query (a sandbox without netlink), ``PeerOwners.available``
is false and the daemon says at start and in ``sidecar status`` that the peer's account is not checked.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
import socket
import struct
import sys
from typing import Final

__all__ = ["PeerOwners", "peer_owner_probe"]

logger = logging.getLogger(__name__)

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST: Final = 0x1
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_ALL_STATES: Final = 0xFFFFFFFF
_NO_OWNER_STATES: Final = frozenset({3, 6, 12})
"""SYN_RECV, TIME_WAIT, NEW_SYN_RECV: the kernel's mini-sockets, which it reports as owned by uid 0."""
_NO_COOKIE: Final = 0xFFFFFFFF

_NLMSGHDR: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid: sport, dport (big-endian),
# then these: src[16], dst[16], if, cookie[2].
_SOCKID_REST: Final = struct.Struct("=16s16sIII")
# inet_diag_msg: family, state, timer, retrans, inet_diag_sockid (48 bytes), expires, rqueue, wqueue, uid.
_UID_OFFSET: Final = 4 + 48 + 12
_REPLY_TIMEOUT: Final = 0.5
"""Seconds to wait for the kernel's answer (it answers in microseconds; this bounds a wedged socket)."""


def _request_bytes(family: int, peer: tuple[str, int], local: tuple[str, int], seq: int) -> bytes:
    """The request for the socket whose own end is ``peer`` and whose remote end is ``local``."""
    # The kernel finds the socket that would receive a packet from id.dst:dport to id.src:sport, so the
    # peer's socket is named by its own address as the source.
    head = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
    ports = struct.pack(">HH", peer[1], local[1])
    rest = _SOCKID_REST.pack(_address(peer[0]), _address(local[0]), 0, _NO_COOKIE, _NO_COOKIE)
    body = head + ports + rest
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0) + body


def _address(text: str) -> bytes:
    """An address as the 16 bytes of ``idiag_src``/``idiag_dst`` (IPv4 in the first four)."""
    packed = ipaddress.ip_address(text.split("%", 1)[0]).packed
    return packed.ljust(16, b"\0")


class PeerOwners:
    """Asks the kernel which uid owns the other end of an accepted TCP connection (Linux)."""

    def __init__(self) -> None:
        self._seq = itertools.count(1)
        self._socket: socket.socket | None = None
        self.available = False
        """True once a query answered: the peer's account is checked at every accept."""
        self.reason = "the peer's OS account cannot be learned on this platform"
        """Why the check is off, when it is (said at start and in ``sidecar status``)."""
        if sys.platform != "linux":
            return
        try:
            self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
            self._socket.settimeout(_REPLY_TIMEOUT)
        except OSError as exc:
            self.reason = f"the kernel's socket-diagnostics netlink is not available ({exc.strerror})"
            return
        uid, why = peer_owner_probe(self)
        if uid == os.getuid():
            self.available = True
            self.reason = ""
        else:
            self.reason = f"the kernel's socket-diagnostics query did not answer for our own socket ({why})"
            self.close()

    def owner_of(self, connection: socket.socket) -> int | None:
        """The uid owning the peer end of ``connection``, or None when the kernel does not say.

        None means "not known", never "allowed": the caller refuses the connection (the peer may also
        have closed its end already, which removes its socket).
        """
        if self._socket is None:
            return None
        try:
            local = connection.getsockname()
            peer = connection.getpeername()
        except OSError:
            return None
        return self.owner(connection.family, local=(local[0], local[1]), peer=(peer[0], peer[1]))

    def owner(self, family: int, *, local: tuple[str, int], peer: tuple[str, int]) -> int | None:
        """The uid owning the TCP socket whose own end is ``peer`` and whose remote end is ``local``."""
        if self._socket is None or family not in (socket.AF_INET, socket.AF_INET6):
            return None
        seq = next(self._seq) & 0xFFFFFFFF
        try:
            self._socket.send(_request_bytes(family, peer, local, seq))
            while True:
                reply = self._socket.recv(8192)
                answer = _parse(reply, seq)
                if answer is not _STALE:
                    return answer if isinstance(answer, int) else None
        except (OSError, ValueError) as exc:
            logger.warning("socket-diagnostics query failed: %s", exc)
            return None

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


_STALE: Final = object()
"""A reply to an earlier query (one that timed out): read on."""


def _parse(reply: bytes, seq: int) -> int | object | None:
    """The uid in a reply to query ``seq``; None for "no such socket"; ``_STALE`` for another query's reply."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(reply):
        length, kind, _flags, reply_seq, _pid = _NLMSGHDR.unpack_from(reply, offset)
        if length < _NLMSGHDR.size:
            raise ValueError("malformed netlink reply")
        if reply_seq != seq:
            return _STALE
        body = offset + _NLMSGHDR.size
        if kind == _SOCK_DIAG_BY_FAMILY:
            if body + _UID_OFFSET + 4 > len(reply):
                raise ValueError("short socket-diagnostics reply")
            if reply[body + 1] in _NO_OWNER_STATES:
                return None  # SECURITY: uid 0 there means "no owner", not root
            (uid,) = struct.unpack_from("=I", reply, body + _UID_OFFSET)
            return int(uid)
        if kind in (_NLMSG_ERROR, _NLMSG_DONE):
            return None  # ENOENT: no such socket (the peer is gone), or the kernel refused
        offset += (length + 3) & ~3
    return None


def peer_owner_probe(owners: PeerOwners) -> tuple[int | None, str]:
    """Ask about a loopback connection of our own: (the uid the kernel names, what went wrong if anything)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            with socket.create_connection(listener.getsockname(), timeout=1.0):
                accepted, _ = listener.accept()
                with accepted:
                    uid = owners.owner_of(accepted)
                    return uid, "" if uid is not None else "no answer"
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
