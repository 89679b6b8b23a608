"""Benchmark: what the connector sandbox costs (issue 22 item 5): a cold spawn and a warm call, sandboxed
and not, in one run.

Against ``python -OO -m sidecar serve --port 0`` (``benchlib.sidecar_daemon``) with ``spares = 0`` (every
first call of a session is a cold start) and two user entries of ``tests/connectors/fixtures/echo_server.py``
(a Python MCP SDK server): ``boxed``, in bubblewrap's sandbox as every connector is, and ``open``, opted out
(``"sidecarSandbox": false``). Each round opens a new session and makes its first call to each (spawn,
``initialize``, the call; the order alternates by round), then ``--warm`` calls to each, interleaved. Calls
are 2026-07-28 single POSTs of ``tools/call`` (``bench_spares.call``; client time included). Printed: each
round's cold ratio, the medians, and boxed/open for both (targets: cold <= 1.2x, warm unchanged).

    .venv/bin/python scripts/bench_sandbox.py             # 15 rounds, ~1 min
    .venv/bin/python scripts/bench_sandbox.py --rounds 3  # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from bench_spares import call, daemon_in, server  # scripts/ is sys.path[0]
from benchlib import log

from sidecar.connectors.stdio.sandbox import detect

COLD_TARGET = 1.2
SETTINGS = "[connectors]\nspares = 0\n"


async def amain(args: argparse.Namespace) -> int:
    support = detect()
    if not support.available:
        print(f"no sandbox here: {support.reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-sandbox-") as tmp:
        workdir = Path(tmp)
        servers = {"boxed": server(workdir), "open": server(workdir, sidecarSandbox=False)}
        with daemon_in(workdir, SETTINGS, servers) as daemon:
            async with aiohttp.ClientSession() as http:
                for connector in servers:
                    await daemon.control(http, "POST", f"/control/connectors/{connector}/trust")
                shown = await daemon.control(http, "GET", "/control/connectors/boxed")
                assert shown["sandbox"]["mode"] == "on", shown["sandbox"]
                cold: dict[str, list[float]] = {name: [] for name in servers}
                warm: dict[str, list[float]] = {name: [] for name in servers}
                rows = []
                for n in range(args.rounds):
                    body: dict[str, Any] = {
                        "workspace": tmp,
                        "mode": "bypass",
                        "allow": ["mcp__boxed__*", "mcp__open__*"],
                    }
                    session = await daemon.control(http, "POST", "/control/sessions", body)
                    order = ("boxed", "open") if n % 2 == 0 else ("open", "boxed")
                    for name in order:
                        cold[name].append(await call(http, session, name))
                    for _ in range(args.warm):
                        for name in order:
                            warm[name].append(await call(http, session, name))
                    await daemon.control(http, "DELETE", f"/control/sessions/{session['session_id']}")
                    rows.append(cold["boxed"][-1] / cold["open"][-1])
                    log(f"round {n + 1}: cold boxed {cold['boxed'][-1]:.0f} ms, open {cold['open'][-1]:.0f} ms")
    median = {
        kind: {name: statistics.median(v) for name, v in d.items()} for kind, d in (("cold", cold), ("warm", warm))
    }
    cold_ratio = median["cold"]["boxed"] / median["cold"]["open"]
    warm_ratio = median["warm"]["boxed"] / median["warm"]["open"]
    print(f"sandbox: {support.reason}; {args.rounds} rounds, {args.warm} warm calls each")
    print(f"per-round cold ratio: min {min(rows):.2f}x  median {statistics.median(rows):.2f}x  max {max(rows):.2f}x")
    print(
        f"cold spawn + first call p50: boxed {median['cold']['boxed']:.0f} ms, open {median['cold']['open']:.0f} ms"
        f" -> {cold_ratio:.2f}x (target <= {COLD_TARGET}x: {'PASS' if cold_ratio <= COLD_TARGET else 'MISS'})"
    )
    print(
        f"warm call p50: boxed {median['warm']['boxed']:.2f} ms, open {median['warm']['open']:.2f} ms"
        f" -> {warm_ratio:.2f}x"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warm", type=int, default=20)
    return asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
