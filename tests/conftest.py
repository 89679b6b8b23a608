"""Shared fixtures: a real daemon on 127.0.0.1:0 (in-process or as a subprocess), MCP clients, raw HTTP.

Every test runs with its own ``SIDECAR_HOME``; every wait is bounded; the autouse ``no_leaked_processes``
fixture fails a test that leaves a child process behind. Helpers that are not about fixtures (tool result
text, bounded waits, trusting a user's connector, HTTP requests) are in ``helpers.py``.

The ``slow`` marker means exactly "starts another process" (a daemon, a connector, Node, a ``python -c``
probe); ``scripts/test --fast`` runs everything else. ``pytest_collection_modifyitems`` below applies it
by fixture and by module, and the autouse ``slow_means_it_spawns`` fixture holds it exact both ways: an
unmarked test that starts a process fails, and so does a marked one that passed without starting any.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx2
import psutil
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sidecar.bus.registry import ToolRegistry
from sidecar.config import DEFAULT_PORT, Settings
from sidecar.connectors.stdio.sandbox import detect
from sidecar.daemon import serve
from sidecar.paths import Paths
from sidecar.service import serve_argv
from sidecar.store.runtime import read_runtime
from tests.helpers import control_request, response_head

START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0

SLOW_FIXTURES: Final = frozenset({"daemon_process"})
"""Fixtures that start a process: a test that uses one, directly or through another fixture, is slow."""
SLOW_MODULES: Final[dict[str, frozenset[str]]] = {
    # module (from the repository root): the names of its tests that start nothing
    "tests/conformance/test_conformance.py": frozenset(),  # Node and the official suite
    "tests/connectors/test_process.py": frozenset(
        {"test_stop_before_start_needs_no_process", "test_limits_must_be_positive"}
    ),
    "tests/e2e/test_cli.py": frozenset(),  # the CLI and the daemon as a user runs them
    "tests/e2e/test_connector_limits.py": frozenset(),  # process caps over real connector processes
    "tests/e2e/test_connector_supervision.py": frozenset(),  # connectors that hang, flood, crash-loop or fork
    "tests/e2e/test_connectors_proxy.py": frozenset(),  # connector processes behind /mcp
    "tests/e2e/test_relay.py": frozenset(),  # a relayed connector process per MCP session
    "tests/e2e/test_third_party_connectors.py": frozenset(),  # servers from PyPI and npm as user connectors
}
"""Modules whose tests start a process, all but the few named."""
SLOW_TESTS: Final = frozenset({"tests/unit/test_trustkey.py::test_the_digest_is_stable_across_runs"})
"""Single tests that start a process, in modules another change owns; elsewhere ``@pytest.mark.slow``."""
_SPAWN_EVENTS: Final = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.system"})
"""Audit events (PEP 578) raised when this process starts another; asyncio's and anyio's subprocesses go
through ``subprocess.Popen``."""
_spawns: list[str] = []
_slow_but_spawned_nothing: list[str] = []


def _audit_spawns(event: str, args: tuple[Any, ...]) -> None:
    if event in _SPAWN_EVENTS:
        _spawns.append(f"{event} {args[1] if event == 'subprocess.Popen' else args[:1]!r}"[:200])


def pytest_configure() -> None:
    # keyring's first backend probe (every daemon chooses its credential key source) runs `ldconfig -p`
    # once per interpreter, through ctypes.util.find_library: done here, before spawns are audited.
    import keyring

    keyring.get_keyring()
    # Under pytest only, not on import (scripts/bench_pool.py imports this module): a hook cannot be removed.
    sys.addaudithook(_audit_spawns)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = item.nodeid.partition("[")[0]  # "tests/unit/test_x.py::test_y", whatever its parameters
        module, _, name = test.partition("::")
        exempt = SLOW_MODULES.get(module)
        fixtures = getattr(item, "fixturenames", ())  # with the fixtures its fixtures use
        if (exempt is not None and name not in exempt) or test in SLOW_TESTS or SLOW_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.slow)


_CALL: Final = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL] = report  # for slow_means_it_spawns, at teardown
    return report


@pytest.fixture(scope="session", autouse=True)
def sandbox_probed() -> None:
    """Probe for the connector sandbox once per test process, before any test's window: a daemon does it
    as it starts (``stdio.sandbox.detect``, cached per process), and an in-process daemon of a fast test
    must find it done rather than start ``bwrap`` itself."""
    detect()


@pytest.fixture(autouse=True)
def slow_means_it_spawns(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that starts a process but is not marked ``slow``; note a ``slow`` one that started none.

    Defined before ``no_leaked_processes`` and so set up before every fixture a test asks for: its window
    holds their set-up and teardown too. A slow test that passed without starting a process is listed at
    the end of the run rather than failed: a few spawn or not by a race (a stop during the spawn).
    """
    before = len(_spawns)
    yield
    spawned = _spawns[before:]
    marked = request.node.get_closest_marker("slow") is not None
    if spawned and not marked:
        pytest.fail(f"started a process but is not marked slow (scripts/test --fast would run it): {spawned[0]}")
    call = request.node.stash.get(_CALL, None)
    if marked and not spawned and call is not None and call.passed:
        _slow_but_spawned_nothing.append(request.node.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _slow_but_spawned_nothing:
        terminalreporter.section("marked slow but started no process (scripts/test --fast could run them)")
        for nodeid in _slow_but_spawned_nothing:
            terminalreporter.line(nodeid)


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail the test if it leaves a child process of the test runner alive."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in before]
    alive = []
    for proc in leaked:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.wait(timeout=5)  # give an exiting child a bounded moment to be reaped
        if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            alive.append(proc)
            proc.kill()
    assert not alive, f"test left processes behind: {[p.pid for p in alive]}"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("SIDECAR_HOME", str(root))
    return root


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@dataclass
class Daemon:
    """A running daemon and the means to drive it as a user would."""

    paths: Paths
    url: str
    port: int
    control_token: str
    workspace: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    async def control(self, method: str, path: str, body: Any = None, *, expect: int | None = 200) -> Any:
        status, data = await control_request(self.url, self.control_token, method, path, body)
        if expect is not None:
            assert status == expect, data
        return data

    async def new_session(self, **spec: Any) -> dict[str, Any]:
        spec.setdefault("workspace", str(self.workspace))
        return await self.control("POST", "/control/sessions", spec, expect=201)  # type: ignore[no-any-return]

    def audit_bytes(self) -> bytes:
        try:
            return self.paths.audit_file.read_bytes()
        except FileNotFoundError:
            return b""

    def audit_events(self, event: str | None = None) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in self.audit_bytes().splitlines() if line.strip()]
        return [r for r in records if event is None or r["event"] == event]


@contextlib.asynccontextmanager
async def running_daemon(
    paths: Paths, workspace: Path, settings: Settings | None = None, registry: ToolRegistry | None = None
) -> AsyncIterator[Daemon]:
    """Run ``serve()`` in this event loop on 127.0.0.1:0 and stop it (bounded) afterwards."""
    ready = asyncio.Event()
    settings = settings or Settings()
    if settings.port == DEFAULT_PORT:  # tests run side by side, and the default port is the user's
        settings = settings.model_copy(update={"port": 0})
    task = asyncio.create_task(serve(settings, paths, registry=registry, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        task.result()
    assert ready.is_set(), "daemon did not start in time"
    runtime = read_runtime(paths)
    assert runtime is not None
    try:
        yield Daemon(paths, runtime["url"], runtime["port"], runtime["control_token"], workspace)
    finally:
        if not task.done():
            await _stop_in_process(runtime, task)


async def _stop_in_process(runtime: dict[str, Any], task: asyncio.Task[int]) -> None:
    status, data = await control_request(runtime["url"], runtime["control_token"], "POST", "/control/stop")
    assert status == 202, data
    await asyncio.wait_for(task, STOP_TIMEOUT)


@pytest.fixture
async def daemon(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    async with running_daemon(Paths.resolve(), workspace) as d:
        yield d


SHARED: Final = pytest.mark.asyncio(loop_scope="module")
"""``pytestmark`` of a module whose tests share ``shared_daemon``: they run on the module's event loop."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Daemon]:
    """One daemon for a module of tests that each open a session of their own and change nothing else.

    Starting a daemon per test was most of a security module's time; a test that needs a fresh daemon
    (it reads the whole audit log, rotates a key, restarts) keeps ``daemon``. A test that uses this one
    runs on the module's event loop (``pytestmark = SHARED``), as must its async fixtures.
    """
    root = tmp_path_factory.mktemp("shared-home")
    workspace = root / "workspace"
    workspace.mkdir()
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    async with running_daemon(paths, workspace) as d:
        yield d


@contextlib.asynccontextmanager
async def mcp_client(session: dict[str, Any], *, mode: str = "legacy", **kwargs: Any) -> AsyncIterator[Client]:
    """The SDK's own client over real HTTP with the session's headers, exactly as a host would use it."""
    async with (
        httpx2.AsyncClient(headers=session["headers"], timeout=30) as http,
        Client(streamable_http_client(session["url"], http_client=http), mode=mode, **kwargs) as client,
    ):
        yield client


async def raw_request(port: int, request: bytes, *, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send bytes on a fresh TCP connection; return (status, headers, body) of the response."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, headers = response_head(head)
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return status, headers, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    paths: Paths
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert result.returncode == 0, (result.stdout, result.stderr)
        return result


def sidecar_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["SIDECAR_HOME"] = str(home)
    return env


async def cli_output(home: Path, *args: str) -> str:
    """``python -m sidecar ARGS`` against the daemon of ``home`` (in-process too: the loop is not blocked);
    its standard output, once it exited 0."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", *args, env=sidecar_env(home), stdout=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(START_TIMEOUT):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    return out.decode()


def start_daemon_process(home: Path, *extra: str) -> DaemonProcess:
    """``python -OO -m sidecar serve --port 0`` (``serve_argv``) as a real subprocess; returns once runtime.json exists.

    The daemon's log goes to ``<home>/daemon.log`` (a file, not a pipe nobody drains: a chatty daemon
    would block on a full pipe).
    """
    env = sidecar_env(home)
    paths = Paths.resolve(env)
    home.mkdir(parents=True, exist_ok=True)
    log = home / "daemon.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            [*serve_argv(), "--port", "0", *extra],  # as scripts/run and the service units run it
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    end = time.monotonic() + START_TIMEOUT
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited early: {log.read_text(errors='replace')[-2000:]}")
        runtime = read_runtime(paths)
        if runtime is not None and runtime.get("pid") == proc.pid:
            return DaemonProcess(proc, paths, env)
        time.sleep(0.02)
    proc.kill()
    proc.wait(5)
    raise AssertionError(f"daemon did not write runtime.json in time: {log.read_text(errors='replace')[-2000:]}")


def stop_daemon_process(daemon: DaemonProcess) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.terminate()
        try:
            daemon.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(5)


@pytest.fixture
def daemon_process(home: Path) -> Iterator[DaemonProcess]:
    d = start_daemon_process(home)
    try:
        yield d
    finally:
        stop_daemon_process(d)
