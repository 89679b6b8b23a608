"""Benchmark: a new session's first connector call, and memory as sessions grow (issue 15 items 3 and 4).

Against ``python -OO -m sidecar serve --port 0`` (``benchlib.sidecar_daemon``) with a throw-away
``SIDECAR_HOME``; the connector is ``tests/connectors/fixtures/echo_server.py`` (a Python MCP SDK server)
configured as the user's own with a ``cwd`` of its own, so nothing in its launch config is per session.
Calls are 2026-07-28 single POSTs of ``tools/call`` ``mcp__<id>__echo`` over aiohttp (client time included).

1. **First call on a new session.** ``SESSIONS`` sessions one after another; for each, the first call's
   latency, then ``WARM`` calls in the same session (warm). With ``spares = 1`` the next session is created
   once the spare is ready (``GET /control/connectors/<id>`` ``spares``), as it is when sessions do not
   arrive within the ~1 s a spare takes (and the warm calls once the next spare is up, so that its start
   slows neither figure); with ``spares = 0`` every first call is a cold start. Printed:
   medians, p95, and first / warm (target with spares: <= 2x). Also with ``"process": "shared"``.
2. **Memory with sharing.** ``--sessions`` sessions (default 50) each call 3 connectors (3 entries of the
   echo server), with ``share_processes = true``: the daemon's RSS and its connector processes' RSS summed
   (target: < 600 MB in all). Per-session processes are measured at a few sessions for comparison (50 x 3 of
   them would be 150 processes of ~60 MB: more than this machine should be asked for, and over the
   default ``max_total``).

    .venv/bin/python scripts/bench_spares.py            # ~2 min
    .venv/bin/python scripts/bench_spares.py --quick    # ~1 min
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from benchlib import answer, control_call, log, sidecar_daemon, unfenced  # scripts/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
ECHO_SERVER = ROOT / "tests" / "connectors" / "fixtures" / "echo_server.py"
MODERN = "2026-07-28"
CONNECTORS = ("echo", "echo2", "echo3")
RSS_TARGET_MB = 600.0
RATIO_TARGET = 2.0


@dataclass
class Daemon:
    proc: Any
    url: str
    token: str
    workdir: Path

    async def control(self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None) -> Any:
        return await control_call(http, self.url, self.token, method, path, body)

    def rss_mb(self) -> tuple[float, float, int]:
        """(daemon RSS, its connector processes' RSS summed, how many of those), in MB."""
        me = psutil.Process(self.proc.pid)
        children = me.children(recursive=True)
        total = 0.0
        for child in children:
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return me.memory_info().rss / 2**20, total / 2**20, len(children)


def _private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


@contextlib.contextmanager
def daemon_in(workdir: Path, settings: str, servers: dict[str, Any]) -> Iterator[Daemon]:
    home = workdir / "home"
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True, mode=0o700)
    _private(config / "sidecar.toml", settings)
    _private(config / "mcp.json", json.dumps({"mcpServers": servers}))
    with sidecar_daemon(workdir, home) as (proc, runtime):
        yield Daemon(proc, runtime["url"], runtime["control_token"], workdir)


_ids = itertools.count(1)


async def call(http: aiohttp.ClientSession, session: dict[str, Any], connector: str) -> float:
    """One ``tools/call`` of ``mcp__<connector>__echo``; its latency in ms (raises on any failure)."""
    request_id = next(_ids)
    name = f"mcp__{connector}__echo"
    headers = {
        **session["headers"],
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": {"text": "bench"}, "_meta": meta},
    }
    start = time.perf_counter()
    async with http.post(session["url"], data=json.dumps(body), headers=headers) as response:
        raw = await response.read()
        elapsed = (time.perf_counter() - start) * 1000.0
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:200]!r}")
        message = answer(response.headers.get("content-type", ""), raw, request_id)
    result = message.get("result") or {}
    content = result.get("content") or [{}]
    if result.get("isError") or unfenced(content[0].get("text")) != "bench":
        raise RuntimeError(f"{name} failed: {json.dumps(message)[:300]}")
    return elapsed


def server(workdir: Path, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(ECHO_SERVER)], "cwd": str(workdir), **extra}


async def new_session(daemon: Daemon, http: aiohttp.ClientSession) -> dict[str, Any]:
    body = {"workspace": str(daemon.workdir), "mode": "bypass", "allow": [f"mcp__{c}__*" for c in CONNECTORS]}
    session: dict[str, Any] = await daemon.control(http, "POST", "/control/sessions", body)
    return session


async def until_spare(daemon: Daemon, http: aiohttp.ClientSession, connector: str) -> None:
    deadline = time.monotonic() + 30
    while (await daemon.control(http, "GET", f"/control/connectors/{connector}"))["spares"] < 1:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no spare of {connector} within 30 s")
        await asyncio.sleep(0.02)


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


async def first_calls(label: str, settings: str, entry_extra: dict[str, Any], sessions: int, warm: int) -> str:
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-spares-") as tmp:
        workdir = Path(tmp)
        with daemon_in(workdir, settings, {"echo": server(workdir, **entry_extra)}) as daemon:
            async with aiohttp.ClientSession() as http:
                await daemon.control(http, "POST", "/control/connectors/echo/trust")
                spares = "spares = 0" not in settings and "process" not in entry_extra
                firsts: list[float] = []
                warms: list[float] = []
                for _ in range(sessions):
                    if spares:
                        await until_spare(daemon, http, "echo")
                    session = await new_session(daemon, http)
                    firsts.append(await call(http, session, "echo"))
                    if spares:  # warm calls on a quiet machine: not while the next spare boots
                        await until_spare(daemon, http, "echo")
                    for _ in range(warm):
                        warms.append(await call(http, session, "echo"))
                first, hot = statistics.median(firsts), statistics.median(warms)
                ratio = first / hot
                verdict = "PASS" if ratio <= RATIO_TARGET else "MISS"
                return (
                    f"{label:<28} first call p50 {first:8.2f} ms  p95 {_p95(firsts):8.2f} ms | warm p50 {hot:6.2f} ms"
                    f"  p95 {_p95(warms):6.2f} ms | first/warm {ratio:6.2f}x"
                    + (f"  (target <= {RATIO_TARGET:g}x: {verdict})" if label != "spares off (cold)" else "")
                )


async def memory(label: str, settings: str, entry_extra: dict[str, Any], sessions: int) -> tuple[str, float]:
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-spares-") as tmp:
        workdir = Path(tmp)
        servers = {c: server(workdir, **entry_extra) for c in CONNECTORS}
        with daemon_in(workdir, settings, servers) as daemon:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as http:
                for connector in CONNECTORS:
                    await daemon.control(http, "POST", f"/control/connectors/{connector}/trust")
                made = [await new_session(daemon, http) for _ in range(sessions)]
                start = time.perf_counter()
                for session in made:
                    await asyncio.gather(*(call(http, session, c) for c in CONNECTORS))
                elapsed = time.perf_counter() - start
                await asyncio.sleep(1.0)  # spares started after the last takes settle
                own, children, count = daemon.rss_mb()
        total = own + children
        line = (
            f"{label:<34} {sessions:3d} sessions x 3 connectors: daemon {own:6.1f} MB + {count:3d} connector "
            f"processes {children:7.1f} MB = {total:7.1f} MB; first calls of all sessions took {elapsed:5.1f} s"
        )
        return line, total


async def amain(args: argparse.Namespace) -> int:
    sessions, warm = (5, 10) if args.quick else (10, 20)
    rows = []
    log("first calls: spares on")
    rows.append(await first_calls("spares on (default)", "[connectors]\nspares = 1\n", {}, sessions, warm))
    log("first calls: spares off")
    rows.append(await first_calls("spares off (cold)", "[connectors]\nspares = 0\n", {}, sessions, warm))
    log("first calls: shared process")
    rows.append(
        await first_calls("process: shared", "[connectors]\nspares = 0\n", {"process": "shared"}, sessions, warm)
    )
    big = 10 if args.quick else args.sessions
    log(f"memory: {big} sessions x 3 shared connectors")
    shared_line, shared_total = await memory(
        "shared (share_processes = true)", "[connectors]\nshare_processes = true\n", {}, big
    )
    log("memory: 5 sessions x 3 per-session connectors")
    own_line, _ = await memory("per session (spares = 0)", "[connectors]\nspares = 0\n", {}, 5)
    print("\n".join(rows))
    verdict = "PASS" if shared_total < RSS_TARGET_MB else "MISS"
    print(f"{shared_line}  (target < {RSS_TARGET_MB:g} MB: {verdict})")
    print(own_line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer sessions and calls (~1 min)")
    parser.add_argument("--sessions", type=int, default=50, help="sessions in the memory run (default 50)")
    return asyncio.run(amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
