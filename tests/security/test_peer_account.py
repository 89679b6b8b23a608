"""The peer's OS account is checked at accept (contract §3, issue 21 item 1), on the real daemon.

Another account (uid 65534, a real process via ``setpriv``) opens connections to the daemon's port and
sends a complete request on each: every one is reset with not a byte answered, nothing of the request
runs or is written, and the whole flood makes one aggregate audit record and one log line. The user's
own clients (this test process) keep working throughout, and at most ``[limits] connections_per_uid``
of their connections are open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from sidecar.config import Limits, Settings
from sidecar.net.frontdoor import ANOTHER_ACCOUNT, OVER_CAP, REFUSED_EVENT
from sidecar.paths import Paths
from tests.attackers import OTHER_UID, as_other_user, needs_other_user
from tests.conftest import Daemon, DaemonProcess, mcp_client, raw_request, running_daemon
from tests.helpers import tool_text, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the peer's account is learned on Linux only")

BOUND: Final = 20.0  # seconds for the attacker's whole run, or any one exchange
FLOOD: Final = 25
ATTACKER: Final = r"""
import json, socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port
answered = []
for _ in range(count):
    try:  # the reset may come back before connect() itself returns
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request)
            answered.append(len(sock.recv(65536)))
    except (ConnectionResetError, BrokenPipeError):
        answered.append(0)
print(json.dumps(answered))
"""


def _healthz(port: int) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()


async def _attack(port: int, count: int) -> list[int]:
    """Bytes answered to each of ``count`` connections opened by another account (each sends a request)."""
    proc = await asyncio.create_subprocess_exec(
        *as_other_user(sys.executable, "-c", ATTACKER, str(port), str(count)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), BOUND)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    answered: list[int] = json.loads(out)
    return answered


@contextlib.asynccontextmanager
async def _daemon(workspace: Path, **limits: Any) -> AsyncIterator[Daemon]:
    settings = Settings(limits=Limits(**limits)) if limits else None
    async with running_daemon(Paths.resolve(), workspace, settings) as daemon:
        yield daemon


@pytest.mark.slow
@needs_other_user()
async def test_another_accounts_connections_are_reset_unanswered_and_audited_in_aggregate(
    home: Path, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        async with _daemon(workspace) as daemon:
            status = await daemon.control("GET", "/control/status")
            assert status["peer_check"]["checked"] is True, status["peer_check"]
            await daemon.new_session()
            journal = daemon.paths.state / "sessions.json"
            sessions_before, audit_before = journal.read_bytes(), daemon.audit_bytes()

            assert await _attack(daemon.port, FLOOD) == [0] * FLOOD  # not one byte answered

            # Nothing ran and nothing was written for them: no record per connection, sessions untouched.
            assert daemon.audit_bytes() == audit_before
            assert journal.read_bytes() == sessions_before
            # The user's own clients are served as before.
            status_code, _, body = await raw_request(daemon.port, _healthz(daemon.port))
            assert (status_code, json.loads(body)) == (200, {"status": "ok"})
            status = await daemon.control("GET", "/control/status")
            peer = status["peer_check"]
            assert peer["refused"] == FLOOD and peer["refused_by_reason"] == {ANOTHER_ACCOUNT: FLOOD}
            assert status["sessions"] == 1
        # The stop writes what the minute had not written yet.
        refused = daemon.audit_events(REFUSED_EVENT)
    assert [(r["uid"], r["count"], r["reasons"]) for r in refused] == [(OTHER_UID, FLOOD, {ANOTHER_ACCOUNT: FLOOD})]
    lines = [r.getMessage() for r in caplog.records if r.name == "sidecar.net.frontdoor"]
    assert len(lines) == 1 and f"uid {OTHER_UID}" in lines[0], lines
    assert not any("HTTP parser" in r.getMessage() or r.name.startswith("aiohttp") for r in caplog.records)


IDLE: Final = 1000
HOLDER: Final = r"""
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(count):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except OSError:
        pass
print(len(held), flush=True)
sys.stdin.readline()  # hold them, sending nothing, until told to go
"""


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@needs_other_user()
async def test_a_thousand_idle_connections_of_another_account_cost_the_user_nothing(
    home: Path, workspace: Path
) -> None:
    async with _daemon(workspace) as daemon:
        session = await daemon.new_session()
        before = _open_files()
        holder = await asyncio.create_subprocess_exec(
            *as_other_user(sys.executable, "-c", HOLDER, str(daemon.port), str(IDLE)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            opened = int(await asyncio.wait_for(holder.stdout.readline(), BOUND))
            assert opened > IDLE // 2  # the handshakes completed: the kernel queued them for accept

            async def all_refused() -> bool:
                return int((await daemon.control("GET", "/control/status"))["peer_check"]["refused"]) >= opened

            await wait_until(all_refused, timeout=BOUND)
            # The daemon holds none of them, and the user's requests are served as before.
            assert _open_files() - before < 20
            status_code, _, body = await asyncio.wait_for(raw_request(daemon.port, _healthz(daemon.port)), BOUND)
            assert (status_code, json.loads(body)) == (200, {"status": "ok"})
            async with asyncio.timeout(BOUND), mcp_client(session) as client:
                assert tool_text(await client.call_tool("calculate", {"expression": "6*7"})) == "42"
        finally:
            if holder.stdin is not None:
                holder.stdin.close()
            try:
                await asyncio.wait_for(holder.wait(), BOUND)
            except TimeoutError:
                holder.kill()
                await holder.wait()


async def test_one_account_holds_at_most_connections_per_uid(home: Path, workspace: Path) -> None:
    async with _daemon(workspace, connections_per_uid=4) as daemon:
        held = []
        for _ in range(4):
            held.append(await asyncio.wait_for(asyncio.open_connection("127.0.0.1", daemon.port), BOUND))
        # A fifth is reset at accept: a whole request, not a byte back.
        with contextlib.suppress(ConnectionResetError):
            status_code, _, _ = await raw_request(daemon.port, _healthz(daemon.port))
            pytest.fail(f"a fifth connection was answered ({status_code})")
        for _, writer in held:
            writer.close()

        async def served() -> bool:
            try:
                return (await raw_request(daemon.port, _healthz(daemon.port)))[0] == 200
            except ConnectionResetError:
                return False  # the daemon has not seen every close yet

        await wait_until(served, timeout=BOUND)
        peer = (await daemon.control("GET", "/control/status"))["peer_check"]
        assert peer["connections_per_uid"] == 4
        assert peer["refused_by_reason"].get(OVER_CAP, 0) >= 1
        assert set(peer["refused_by_reason"]) == {OVER_CAP}
    refused = daemon.audit_events(REFUSED_EVENT)
    assert [(r["uid"], r["reasons"]) for r in refused] == [(os.getuid(), {OVER_CAP: refused[0]["count"]})]


async def test_a_daemon_in_the_test_process_leaves_its_open_files_limit_alone(home: Path, workspace: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = soft - 1 if soft == hard else soft  # so that raising it would show
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        async with _daemon(workspace):
            assert resource.getrlimit(resource.RLIMIT_NOFILE) == (lowered, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _limits_of(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line in /proc/<pid>/limits")


@pytest.mark.slow
def test_sidecar_serve_raises_its_open_files_limit_to_the_hard_limit(daemon_process: DaemonProcess) -> None:
    soft, hard = _limits_of(daemon_process.proc.pid)
    assert soft == hard, (soft, hard)
