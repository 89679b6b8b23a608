"""A hostile connector in its sandbox (issue 22): trusted, granted, and still it gets nothing of sidecar's
or of the user's (contract §5).

The connector (``fixtures/hostile.py``) is a user's server with one LOW tool that tries, from inside, what
a compromised package would: find the daemon's ``SIDECAR_HOME`` in ``/proc/*/environ``, read
``runtime.json`` (the control token), ``credentials.key`` and ``credentials.enc``, ``sessions.json``, a
planted ``~/.ssh/id_ed25519`` and keyring file, and a key in the session keyring it inherits; write
``~/.bashrc`` and a file outside its workspace; reach the control API, a listener and a resolver on the
host's loopback and a listener on an abstract UNIX socket (where an X11 display or a D-Bus bus listens),
and resolve a name. The daemon runs as a real process with a planted home. The same connector opted out
(``"sidecarSandbox": false``) reads and reaches them all, so the refusals are the sandbox's doing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from sidecar.connectors.stdio.sandbox import detect
from sidecar.store.runtime import read_runtime
from tests.attackers import needs_sandbox, plant_session_key
from tests.conftest import Daemon, mcp_client, start_daemon_process, stop_daemon_process
from tests.helpers import FIXTURES, python_server, tool_text, trust, write_user_servers

pytestmark = [pytest.mark.slow, needs_sandbox()]

SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----planted"
SESSION_KEY = ("sidecar-test-planted", "a login's ticket")
BASHRC = "# the user's own .bashrc\n"


@dataclass
class Victim:
    daemon: Daemon
    home: Path
    outside: Path
    listener: int
    abstract: str
    """The name of a host listener on an abstract UNIX socket, as an X11 display's ``@/tmp/.X11-unix/X0``."""
    resolver: int
    """A UDP port on the host's loopback that answers, where a resolver listens (systemd-resolved's
    127.0.0.53:53): resolving a name is reaching it (this machine's own resolver answers nothing)."""


@pytest.fixture
def planted_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's real home, with what an attacker wants in it; the daemon runs with it as ``$HOME``."""
    real = tmp_path / "user"
    (real / ".ssh").mkdir(parents=True)
    (real / ".ssh" / "id_ed25519").write_text(SSH_KEY)
    (real / ".local" / "share" / "keyrings").mkdir(parents=True)
    (real / ".local" / "share" / "keyrings" / "login.keyring").write_text("keyring secrets")
    (real / ".bashrc").write_text(BASHRC)
    monkeypatch.setenv("HOME", str(real))
    return real


@pytest.fixture
def daemon_with_home(home: Path, planted_home: Path, workspace: Path) -> Iterator[Daemon]:
    plant_session_key(SESSION_KEY[0], SESSION_KEY[1].encode())  # the daemon, and so its connectors, inherit it
    process = start_daemon_process(home)
    try:
        runtime = read_runtime(process.paths)
        assert runtime is not None
        yield Daemon(process.paths, runtime["url"], runtime["port"], runtime["control_token"], workspace)
    finally:
        stop_daemon_process(process)


@pytest.fixture
async def victim(daemon_with_home: Daemon, planted_home: Path, tmp_path: Path) -> AsyncIterator[Victim]:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HOST LISTENER")
        await writer.drain()
        writer.close()

    outside = tmp_path / "outside"
    outside.mkdir()
    abstract = f"sidecar-test-display-{os.getpid()}-{tmp_path.name}"
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    display = await asyncio.start_unix_server(answer, "\0" + abstract)
    resolver, _ = await asyncio.get_running_loop().create_datagram_endpoint(_Resolver, local_addr=("127.0.0.1", 0))
    try:
        port = server.sockets[0].getsockname()[1]
        yield Victim(daemon_with_home, planted_home, outside, port, abstract, resolver.get_extra_info("sockname")[1])
    finally:
        resolver.close()
        for listener in (server, display):
            listener.close()
            await listener.wait_closed()


class _Resolver(asyncio.DatagramProtocol):
    """Answers every datagram with ``RESOLVED``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # the selector's is not a subclass of it

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.transport.sendto(b"RESOLVED", addr)


async def _attack(victim: Victim, **entry: Any) -> dict[str, str]:
    daemon = victim.daemon
    write_user_servers(daemon, {"hostile": {**python_server(FIXTURES / "hostile.py"), **entry}})
    await trust(daemon, "hostile")
    session = await daemon.new_session(mode="bypass", allow=["mcp__hostile__*"])
    paths = daemon.paths
    reads = [
        paths.runtime_file,
        paths.state / "sessions.json",
        paths.data / "credentials.key",
        paths.data / "credentials.enc",
        victim.home / ".ssh" / "id_ed25519",
        victim.home / ".local" / "share" / "keyrings" / "login.keyring",
    ]
    runtime = read_runtime(paths)
    assert runtime is not None
    reads.append(Path(f"/proc/{runtime['pid']}/environ"))
    assert all(path.exists() for path in reads), [str(p) for p in reads if not p.exists()]  # so a read could work
    arguments = {
        "reads": [str(path) for path in reads],
        "writes": [str(victim.home / ".bashrc"), str(victim.outside / "dropped.txt")],
        "ports": [victim.listener, daemon.port],
        "resolvers": [victim.resolver],
        "abstract": [victim.abstract],
        "keys": [SESSION_KEY[0]],
        "names": ["example.com"],
        "urls": [f"{daemon.url}/control/status"],
    }
    async with mcp_client(session) as client:
        result = await client.call_tool("mcp__hostile__attempt", arguments)
    assert not result.is_error, tool_text(result)
    outcomes: dict[str, str] = json.loads(tool_text(result))
    assert (await daemon.control("GET", "/control/status"))["pid"] == runtime["pid"]  # the daemon is healthy
    return outcomes


def _failed(outcomes: dict[str, str], prefix: str) -> dict[str, str]:
    return {k: v for k, v in outcomes.items() if k.startswith(prefix) and not v.startswith("error")}


def _session_key_as_said(outcomes: dict[str, str]) -> None:
    """The key in the session keyring it inherited: refused where seccomp keeps the keyrings out (libseccomp
    is installed), else read, as status says."""
    if detect().keyrings_refused:
        assert outcomes[f"key {SESSION_KEY[0]}"].startswith("error: PermissionError"), outcomes
    else:
        assert outcomes[f"key {SESSION_KEY[0]}"] == f"ok: {SESSION_KEY[1]}"


def _nothing_written(victim: Victim) -> None:
    assert (victim.home / ".bashrc").read_text() == BASHRC
    assert not (victim.outside / "dropped.txt").exists()


async def test_an_offline_hostile_connector_reads_writes_and_reaches_nothing(victim: Victim) -> None:
    outcomes = await _attack(victim, sidecarNetwork=False)
    assert outcomes["find SIDECAR_HOME"].startswith("error"), outcomes
    assert _failed(outcomes, "read ") == {}
    assert _failed(outcomes, "connect ") == {}  # neither the host's listener nor the daemon's port
    assert _failed(outcomes, "resolve ") == {}
    assert _failed(outcomes, "query ") == {}  # nor a resolver on the host's loopback
    assert _failed(outcomes, "request ") == {}
    _session_key_as_said(outcomes)
    _nothing_written(victim)
    granted = [r for r in victim.daemon.audit_events("trust.granted") if r["name"] == "hostile"]
    assert granted[-1]["sandbox"] == "on"


async def test_a_hostile_connector_with_the_network_still_reads_nothing_and_the_control_api_refuses_it(
    victim: Victim,
) -> None:
    outcomes = await _attack(victim)
    assert outcomes["find SIDECAR_HOME"].startswith("error"), outcomes
    assert _failed(outcomes, "read ") == {}
    assert outcomes[f"connect {victim.listener}"] == "ok: HOST LISTENER"  # it has the network it needs
    assert outcomes[f"query {victim.resolver}"] == "ok: RESOLVED"
    shown = await victim.daemon.control("GET", "/control/connectors/hostile")
    if detect().scoped:  # Landlock (Linux >= 6.12) scopes the host's abstract sockets away
        assert outcomes[f"connect @{victim.abstract}"].startswith("error: PermissionError"), outcomes
        assert shown["sandbox"]["abstract_sockets"] == "none"
    else:  # an older kernel: reachable, and said so
        assert outcomes[f"connect @{victim.abstract}"] == "ok: HOST LISTENER"
        assert shown["sandbox"]["abstract_sockets"] == "reachable"
    _session_key_as_said(outcomes)
    status = (await victim.daemon.control("GET", "/control/status"))["sandbox"]
    assert (status["abstract_sockets_scoped"], status["keyrings_refused"]) == (
        detect().scoped,
        detect().keyrings_refused,
    )
    assert outcomes[f"request {victim.daemon.url}/control/status"].startswith("error: HTTPError: HTTP Error 401")
    _nothing_written(victim)


async def test_the_same_connector_opted_out_of_the_sandbox_reads_everything(victim: Victim) -> None:
    outcomes = await _attack(victim, sidecarSandbox=False)
    assert outcomes["find SIDECAR_HOME"].startswith("ok"), outcomes
    assert _failed(outcomes, "read ") == {k: v for k, v in outcomes.items() if k.startswith("read ")}
    assert SSH_KEY[:40] in outcomes[f"read {victim.home / '.ssh' / 'id_ed25519'}"]
    assert "control_token" in outcomes[f"read {victim.daemon.paths.runtime_file}"]
    assert outcomes[f"connect @{victim.abstract}"] == "ok: HOST LISTENER"
    assert outcomes[f"query {victim.resolver}"] == "ok: RESOLVED"
    assert outcomes[f"key {SESSION_KEY[0]}"] == f"ok: {SESSION_KEY[1]}"
    assert (victim.home / ".bashrc").read_text() == BASHRC + "echo pwned\n"
    assert (victim.outside / "dropped.txt").exists()
    granted = [r for r in victim.daemon.audit_events("trust.granted") if r["name"] == "hostile"]
    assert granted[-1]["sandbox"] == "off"
    shown = await victim.daemon.control("GET", "/control/connectors/hostile")
    assert shown["sandbox"]["mode"] == "off"
