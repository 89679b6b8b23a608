"""The kernel names the account behind the other end of a loopback connection (``sidecar.net.peer``)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sidecar.net import peer
from sidecar.net.peer import PeerOwners
from tests.attackers import OTHER_UID, as_other_user, needs_other_user

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the peer's account is learned on Linux only")


@pytest.fixture
def owners() -> Iterator[PeerOwners]:
    found = PeerOwners()
    assert found.available, found.reason
    yield found
    found.close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.settimeout(10)
        yield sock


def test_a_connection_of_our_own_is_owned_by_our_uid(owners: PeerOwners, listener: socket.socket) -> None:
    with socket.create_connection(listener.getsockname(), timeout=5):
        accepted, _ = listener.accept()
        with accepted:
            assert owners.owner_of(accepted) == os.getuid()


def test_an_ipv6_loopback_connection_is_answered_too(owners: PeerOwners) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("::1", 0))
        except OSError:
            pytest.skip("::1 is not configured here")
        sock.listen(1)
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            accepted, _ = sock.accept()
            with accepted:
                assert owners.owner_of(accepted) == os.getuid()


def test_a_peer_that_reset_its_socket_has_no_owner(owners: PeerOwners, listener: socket.socket) -> None:
    client = socket.create_connection(listener.getsockname(), timeout=5)
    accepted, _ = listener.accept()
    with accepted:
        # SO_LINGER 0: close sends RST and the kernel forgets the client's socket at once.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        assert owners.owner_of(accepted) is None


@pytest.mark.slow
@needs_other_user()
def test_a_connection_from_another_account_names_that_account(owners: PeerOwners, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    code = f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); sys.stdin.read()"
    with subprocess.Popen(as_other_user(sys.executable, "-c", code), stdin=subprocess.PIPE) as attacker:
        try:
            accepted, _ = listener.accept()
            with accepted:
                assert owners.owner_of(accepted) == OTHER_UID
        finally:
            assert attacker.stdin is not None
            attacker.stdin.close()
            attacker.wait(timeout=10)


def test_a_reply_to_an_earlier_query_is_read_past() -> None:
    stale = peer._NLMSGHDR.pack(peer._NLMSGHDR.size + 72, peer._SOCK_DIAG_BY_FAMILY, 0, 7, 0) + bytes(72)
    assert peer._parse(stale, 8) is peer._STALE


def test_a_time_wait_socket_is_not_taken_for_roots() -> None:
    body = bytearray(72)
    body[1] = 6  # TCP_TIME_WAIT, which the kernel reports with uid 0
    reply = peer._NLMSGHDR.pack(peer._NLMSGHDR.size + len(body), peer._SOCK_DIAG_BY_FAMILY, 0, 3, 0) + bytes(body)
    assert peer._parse(reply, 3) is None
    body[1] = 1  # ESTABLISHED
    reply = peer._NLMSGHDR.pack(peer._NLMSGHDR.size + len(body), peer._SOCK_DIAG_BY_FAMILY, 0, 3, 0) + bytes(body)
    assert peer._parse(reply, 3) == 0


def test_an_error_reply_means_unknown() -> None:
    reply = peer._NLMSGHDR.pack(peer._NLMSGHDR.size + 4, peer._NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", -2)
    assert peer._parse(reply, 5) is None
