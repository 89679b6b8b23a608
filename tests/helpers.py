"""Plain helpers the test modules share; the fixtures (and the ``Daemon`` they yield) are in ``conftest.py``.

Every wait here is bounded: ``wait_until`` polls under ``asyncio.timeout``, and every HTTP request has a
total timeout. The bounds are fail-safes, never timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import psutil
from mcp import types

if TYPE_CHECKING:
    from tests.conftest import Daemon

FIXTURES: Final = Path(__file__).resolve().parent / "connectors" / "fixtures"
"""MCP servers written for the tests (``echo_server.py``, ``forker.py``, …), run as user connectors."""
ECHO_SERVER: Final = FIXTURES / "echo_server.py"
HTTP_TIMEOUT: Final = 15.0
"""Seconds one HTTP request to the daemon may take."""
BOUND: Final = 30.0
"""Seconds a condition may take to come true before ``wait_until`` gives up."""


_FENCED: Final = re.compile(
    r'<untrusted-content connector="([a-z0-9-]+)" fence="([0-9a-f]{8})">\n(.*)\n</untrusted-content fence="\2">', re.S
)


def unfenced(text: str) -> str:
    """A connector's text without the untrusted-content fence the bus puts around it (``bus/untrusted.py``)."""
    found = _FENCED.fullmatch(text)
    return found.group(3) if found is not None else text


def tool_text(result: types.CallToolResult) -> str:
    """The text of an MCP tool result's first content block, which must be text; a connector's without
    its untrusted-content fence (tests/e2e/test_untrusted_output.py checks the fence itself)."""
    block = result.content[0]
    assert isinstance(block, types.TextContent), result
    return unfenced(block.text)


def child_pids() -> set[int]:
    """The pids of every descendant of the test runner (connector processes included), but the ``bwrap``
    processes that hold each sandboxed connector (``sandboxes``)."""
    return {p.pid for p in psutil.Process().children(recursive=True)} - sandboxes()


def host_pid(pid: int, pidns: str) -> int:
    """The pid on the host of the test runner's descendant that is ``pid`` in PID namespace ``pidns`` (as
    a process reports itself: ``os.getpid()``, ``readlink /proc/self/ns/pid``). A sandboxed connector has a
    namespace of its own, so its pid there (2) says nothing here; one unsandboxed shares ours."""
    if pidns == os.readlink("/proc/self/ns/pid"):
        return pid
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{child.pid}/status").read_text()
            inner = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
            if os.readlink(f"/proc/{child.pid}/ns/pid") == pidns and int(inner) == pid:
                return child.pid
    raise LookupError(f"no descendant is pid {pid} in {pidns}")


def sandboxes() -> set[int]:
    """The pids of the ``bwrap`` processes among the test runner's descendants: two around each sandboxed
    connector (the outer one, and the init of its PID namespace)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name() == "bwrap":
                found.add(child.pid)
    return found


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout: float = BOUND, interval: float = 0.05
) -> None:
    """Poll ``condition`` (a function, or a coroutine function) every ``interval`` seconds until it is true;
    raise ``TimeoutError`` after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            met = condition()
            if inspect.isawaitable(met):
                met = await met
            if met:
                return
            await asyncio.sleep(interval)


# -- HTTP ---------------------------------------------------------------------------------------------


async def request_json(
    method: str, url: str, *, headers: Mapping[str, str] | None = None, body: Any = None
) -> tuple[int, Any]:
    """One HTTP request (``body`` sent as JSON unless None); the status and the response's JSON."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http,
        http.request(method, url, json=body, headers=headers) as response,
    ):
        return response.status, await response.json(content_type=None)


async def control_request(url: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request to the control API of the daemon at ``url``, with its control token."""
    return await request_json(method, url + path, headers={"Authorization": f"Bearer {token}"}, body=body)


async def rest(daemon: Daemon, method: str, path: str, headers: Mapping[str, str], body: Any = None) -> tuple[int, Any]:
    """A request to the REST facade with a session's headers (``session["headers"]``)."""
    return await request_json(method, daemon.url + path, headers=headers, body=body)


def initialize_request(client: str, *, protocol: str = "2025-11-25") -> dict[str, Any]:
    """A raw JSON-RPC ``initialize`` request (id 1) from a client named ``client``."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": protocol, "capabilities": {}, "clientInfo": {"name": client, "version": "0"}},
    }


def response_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status and headers (names in lower case) of a raw HTTP/1.x response head."""
    status_line, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


# -- the user's connectors ----------------------------------------------------------------------------


def copy_echo_server(directory: Path) -> Path:
    """The echo fixture as a package's ``server.py``, with the fixtures' shared tools beside it (0600)."""
    server = directory / "server.py"
    server.write_bytes(ECHO_SERVER.read_bytes())
    shared = directory / "common_tools.py"
    shared.write_bytes((FIXTURES / "common_tools.py").read_bytes())
    for file in (server, shared):
        file.chmod(0o600)
    return server


def python_server(
    script: Path, *args: str, env: Mapping[str, str] | None = None, writes: Path | None = None
) -> dict[str, Any]:
    """An ``mcp.json`` entry that runs ``script`` with this interpreter; its sandbox shows it ``writes``
    read-write (where the test and the server share files), as a user's entry would declare it."""
    entry: dict[str, Any] = {"command": sys.executable, "args": [str(script), *args]}
    if env is not None:
        entry["env"] = dict(env)
    if writes is not None:
        entry["sidecarSandbox"] = {"writePaths": [str(writes)]}
    return entry


def write_config(path: Path, content: Any, *, mode: int = 0o600) -> Path:
    """Write a config file the daemon reads: ``content`` as JSON (a string as it is), its directories made,
    mode 0600 unless told (the umask must not decide whether a test file is trusted)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    path.chmod(mode)
    return path


def write_user_servers(daemon: Daemon, servers: Mapping[str, Any]) -> None:
    """Make ``servers`` the user's own MCP servers: ``<config>/mcp.json``, mode 0600 as the daemon requires."""
    write_config(daemon.paths.config / "mcp.json", {"mcpServers": servers})


@contextlib.asynccontextmanager
async def listening_server(script: Path, *args: str) -> AsyncIterator[int]:
    """Run ``python script *args``, an HTTP server that prints ``LISTENING <port>`` once it accepts
    connections; yield that port, and stop it on the way out."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(server.stdout.readline(), BOUND)
        assert line.startswith(b"LISTENING "), line
        yield int(line.split()[1])
    finally:
        if server.returncode is None:
            server.terminate()
        await asyncio.wait_for(server.wait(), BOUND)


async def trust(daemon: Daemon, connector_id: str) -> dict[str, Any]:
    """Trust a connector through the control API (which starts it once to learn its tools); its status."""
    shown: dict[str, Any] = await daemon.control("POST", f"/control/connectors/{connector_id}/trust")
    assert shown["state"] == "trusted", shown
    return shown


async def trust_user_server(
    daemon: Daemon, connector_id: str, script: Path, *, writes: Path | None = None
) -> dict[str, Any]:
    """Configure ``python script`` as the user's only MCP server, ``connector_id``, and trust it; its status."""
    write_user_servers(daemon, {connector_id: python_server(script, writes=writes)})
    return await trust(daemon, connector_id)


async def running(daemon: Daemon, connector_id: str) -> int:
    """How many processes of a connector run now, as the control API reports."""
    return int((await daemon.control("GET", f"/control/connectors/{connector_id}"))["running"])


async def until_running(
    daemon: Daemon, connector_id: str, count: int, *, timeout: float = BOUND, interval: float = 0.05
) -> None:
    """Wait (bounded) until exactly ``count`` processes of a connector run."""

    async def reached() -> bool:
        return await running(daemon, connector_id) == count

    await wait_until(reached, timeout=timeout, interval=interval)


def run_probe(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter from the checkout (bounded); the words it printed.

    A failure of the probe itself fails the test, with its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()
