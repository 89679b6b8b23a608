"""Benchmark: cost as the work grows - calls/s and memory at 1, 10 and 50 sessions, each using 3 connectors.

The daemon (``python -OO -m sidecar serve``, throw-away ``SIDECAR_HOME``) trusts three user connectors,
``echo0``..``echo2`` (each the echo fixture, ``tests/connectors/fixtures/echo_server.py``), with the caps
raised above 50 sessions x 3 (``[connectors] max_per_connector = 64``, ``max_total = 256``). For each
level N, N sessions are created (``bypass``, allowed ``*``); each calls every connector once (which starts
its processes: one per session and connector, the default), then N callers - one per session, raw
2026-07-28 POSTs from one aiohttp client in this process - call ``mcp__echoK__echo`` round-robin for a
fixed number of calls. Printed per level: calls/s, p50 and p99, the daemon's RSS, and its connector
processes' count, summed RSS and summed PSS (RSS counts shared pages in every process; PSS splits
them). The sessions are ended (their processes stop) before the next level.

    .venv/bin/python scripts/bench_scale.py            # levels 1, 10, 50
    .venv/bin/python scripts/bench_scale.py --quick    # fewer calls
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import bench_connectors as bc  # scripts/ is sys.path[0]
import psutil
from benchlib import log, sidecar_daemon

LEVELS = (1, 10, 50)
CONNECTORS = ("echo0", "echo1", "echo2")
SPAWNING = 4
"""Sessions making their first calls (starting their processes) at once."""


def _memory(pid: int) -> tuple[float, int, float, float]:
    """(daemon RSS, connector processes, their RSS sum, their PSS sum), MB."""
    daemon = psutil.Process(pid)
    rss = pss = 0.0
    children = daemon.children(recursive=True)
    for child in children:
        try:
            info = child.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", 0)
    return daemon.memory_info().rss / 2**20, len(children), rss / 2**20, pss / 2**20


async def level(http: aiohttp.ClientSession, daemon: bc.Daemon, n: int, calls: int) -> dict[str, Any]:
    sessions = [await daemon.new_session(http) for _ in range(n)]
    try:

        async def call(session: dict[str, Any], k: int) -> None:
            tool = f"mcp__{CONNECTORS[k % len(CONNECTORS)]}__echo"
            result = await bc.raw_modern(http, session, "tools/call", {"name": tool, "arguments": {"text": "x"}}, tool)
            if result.get("isError"):
                raise RuntimeError(f"{tool} failed: {result}")

        # The first calls start the processes; a few sessions at a time, as 150 Python processes starting at
        # once on 2 cores would outrun the start timeout.
        gate = asyncio.Semaphore(SPAWNING)

        async def first_calls(session: dict[str, Any]) -> None:
            async with gate:
                await asyncio.gather(*(call(session, k) for k in range(len(CONNECTORS))))

        started = time.perf_counter()
        await asyncio.gather(*(first_calls(s) for s in sessions))
        warm_s = time.perf_counter() - started
        per_caller = max(len(CONNECTORS), calls // n)
        samples: list[float] = []

        async def caller(session: dict[str, Any]) -> None:
            for k in range(per_caller):
                start = time.perf_counter()
                await call(session, k)
                samples.append((time.perf_counter() - start) * 1000.0)

        started = time.perf_counter()
        await asyncio.gather(*(caller(s) for s in sessions))
        wall = time.perf_counter() - started
        daemon_rss, processes, rss, pss = _memory(daemon.pid)
    finally:
        for session in sessions:
            await daemon.end_session(http, session)
    if not await daemon.settle():
        log("connector processes outlived their sessions")
    ordered = sorted(samples)
    return {
        "sessions": n,
        "start_s": warm_s,
        "calls_s": len(samples) / wall,
        "p50": statistics.median(ordered),
        "p99": ordered[int(0.99 * (len(ordered) - 1))],
        "daemon_rss": daemon_rss,
        "processes": processes,
        "rss": rss,
        "pss": pss,
    }


async def amain(args: argparse.Namespace) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-scale-") as tmp:
        workdir = Path(tmp)
        home = workdir / "home"
        from sidecar.paths import Paths

        paths = Paths.resolve({"SIDECAR_HOME": str(home)})
        paths.config.mkdir(parents=True)
        toml = paths.config / "sidecar.toml"
        toml.write_text("[connectors]\nmax_per_connector = 64\nmax_total = 256\n")
        toml.chmod(0o600)
        workspace = workdir / "workspace"
        workspace.mkdir()
        with sidecar_daemon(workdir, home) as (proc, runtime):
            daemon = bc.Daemon(proc, runtime["url"], runtime["control_token"], paths.config, workspace)
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120)
            ) as http:
                bc.write_user_servers(daemon, list(CONNECTORS))
                for connector in CONNECTORS:
                    await bc.trust(http, daemon, connector)
                await daemon.settle()
                idle = daemon.rss_mb()
                for n in args.levels:
                    log(f"{n} sessions x {len(CONNECTORS)} connectors")
                    rows.append(await level(http, daemon, n, args.calls))
                    log(f"  {rows[-1]['calls_s']:.0f} calls/s, {rows[-1]['processes']} connector processes")
    print(
        f"cost as the work grows: {len(CONNECTORS)} stdio connectors (echo fixture), per-session processes; "
        f"~{args.calls} calls per level, one sequential raw 2026-07-28 caller per session; daemon idle RSS "
        f"after trusting them {idle:.1f} MB"
    )
    print(
        "sessions | first calls s (3 spawns each, 4 sessions at a time) | calls/s | p50 ms | p99 ms | daemon RSS MB | "
        "connector processes | their RSS sum MB | their PSS sum MB"
    )
    for r in rows:
        print(
            f"{r['sessions']:8d} | {r['start_s']:48.1f} | {r['calls_s']:7.0f} | {r['p50']:6.2f} | {r['p99']:6.2f} | "
            f"{r['daemon_rss']:13.1f} | {r['processes']:19d} | {r['rss']:16.0f} | {r['pss']:16.0f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_scale.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls per level")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="session counts")
    args = parser.parse_args(argv)
    args.calls = 600 if args.quick else 3000
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
