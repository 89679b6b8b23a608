"""Benchmark: ``tools/call`` through the sidecar's ``/mcp`` next to the MCP SDK's own uvicorn server.

Both servers run as subprocesses of this script:

* **sidecar**: ``python -m sidecar serve --port 0`` with a throw-away ``SIDECAR_HOME``; one session is
  created through the control API and its ``url``/``headers`` are used for every request, so the
  Host/Origin guard, the route bearer token and the HMAC session envelope are all on the measured path.
  The tool is the built-in ``calculate`` with ``{"expression": "1+1"}``.
* **reference**: ``scripts/bench_reference_server.py``: a lowlevel SDK ``Server`` with a ``calculate``
  tool of the same schema, ``streamable_http_app()`` defaults, served by uvicorn.

Clients (identical code for both servers, run in this process):

* **sdk-legacy / sdk-auto**: the SDK ``Client`` over ``streamable_http_client`` (httpx2), ``mode="legacy"``
  (2025-11-25 handshake) and ``mode="auto"`` (2026-07-28); sequential calls after a warm-up.
* **raw-legacy / raw-modern**: aiohttp posting hand-built JSON-RPC (legacy: ``initialize`` +
  ``notifications/initialized``, then ``tools/call`` with ``Mcp-Session-Id``, SSE answer parsed; modern:
  one POST with the 2026-07-28 headers and ``_meta`` envelope). This isolates server cost.
* **concurrency**: 1, 8 and 32 raw callers at once (legacy: one MCP session per caller) → calls/s and
  latency.

Noise control: every measurement is repeated in rounds that alternate which server goes first; a figure
is the median over rounds of the per-round median (latency) or of the per-round rate (throughput).
Numbers from a shared 2-core machine move ±20-30 % between runs: compare the two columns of one run.

Then the sidecar's RSS: idle right after start, and before/after ``--rss-calls`` raw calls (default
20 000, half legacy, half modern, 8 callers).

    scripts/bench            # full run (a few minutes)
    scripts/bench --quick    # smoke run (~30 s)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import psutil
from benchlib import (  # scripts/ is sys.path[0]
    START_TIMEOUT,
    CallFailed,
    answer,
    log,
    sidecar_daemon,
    stop,
    tail,
    timed,
    unfenced,
)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SCRIPT = ROOT / "scripts" / "bench_reference_server.py"

TOOL = "calculate"
ARGS = {"expression": "1+1"}
EXPECTED_TEXT = "2"
LEGACY_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
LEVELS = (1, 8, 32)

IDLE_RSS_LIMIT_MB = 80.0
RSS_GROWTH_LIMIT_PCT = 5.0


# --------------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------------


@dataclass
class Target:
    """A server under test: where to POST and with which extra headers."""

    name: str
    url: str
    headers: dict[str, str]
    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    def cpu_seconds(self) -> float:
        """User + system CPU the server process has used so far."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)


@contextlib.contextmanager
def sidecar_process(
    workdir: Path, profile: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """The daemon as a subprocess with its own SIDECAR_HOME; with ``profile``, under cProfile."""
    python_args = ["-m", "cProfile", "-o", profile] if profile else []
    with sidecar_daemon(workdir, workdir / "home", python_args=python_args) as started:
        yield started


@contextlib.contextmanager
def reference_process(workdir: Path, *flags: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The SDK reference server (``flags``: its options); yields (process, port) once it accepts connections."""
    proc = subprocess.Popen(
        [sys.executable, str(REFERENCE_SCRIPT), "--port", "0", *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=(workdir / "reference.stderr").open("wb"),
        cwd=workdir,
    )
    try:
        assert proc.stdout is not None
        line = _readline_with_timeout(proc, START_TIMEOUT)
        if not line.startswith(b"LISTENING "):
            raise RuntimeError(f"reference server did not start: {line!r} {tail(workdir / 'reference.stderr')}")
        yield proc, int(line.split()[1])
    finally:
        stop(proc, "reference")
        if proc.stdout is not None:
            proc.stdout.close()


def _readline_with_timeout(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return b""
    return proc.stdout.readline().strip()


async def create_sidecar_session(runtime: dict[str, Any], workspace: Path) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            runtime["url"] + "/control/sessions",
            json={"workspace": str(workspace), "project": "bench"},
            headers={"Authorization": f"Bearer {runtime['control_token']}"},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as response,
    ):
        data = await response.json(content_type=None)
        if response.status != 201:
            raise RuntimeError(f"POST /control/sessions answered {response.status}: {data}")
        return data  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


def _check_result(message: dict[str, Any], expected: str = EXPECTED_TEXT) -> None:
    result = message.get("result")
    if not isinstance(result, dict) or result.get("isError"):
        raise CallFailed(f"tools/call failed: {json.dumps(message)[:300]}")
    content = result.get("content") or [{}]
    if unfenced(content[0].get("text")) != expected:
        raise CallFailed(f"unexpected tools/call result: {json.dumps(message)[:300]}")


class RawCaller:
    """One hand-built JSON-RPC client of one era; legacy callers hold their own MCP session."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        target: Target,
        era: str,
        call: tuple[str, dict[str, Any], str] | None = None,
    ) -> None:
        """``call``: (tool, arguments, expected text); default the module's ``TOOL``, ``ARGS``, ``EXPECTED_TEXT``
        as they are when the caller is made (``bench_ab`` points them at a connector tool)."""
        self._tool, self._args, self._expected = call or (TOOL, ARGS, EXPECTED_TEXT)
        self._http = http
        self._url = target.url
        self._era = era
        self._ids = itertools.count(1)
        self._session_id: str | None = None
        self._headers = {
            **target.headers,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }

    async def open(self) -> None:
        if self._era != "legacy":
            self._headers["MCP-Protocol-Version"] = MODERN_VERSION
            self._headers["Mcp-Method"] = "tools/call"
            self._headers["Mcp-Name"] = self._tool
            return
        request_id = next(self._ids)
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "bench-raw", "version": "1"},
            },
        }
        async with self._http.post(self._url, data=json.dumps(body), headers=self._headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise CallFailed(f"initialize answered {response.status}: {raw[:300]!r}")
            session_id = response.headers.get("mcp-session-id")
            message = answer(response.headers.get("content-type", ""), raw, request_id)
            if "result" not in message or not session_id:
                raise CallFailed(f"initialize failed: {message}")
        self._session_id = session_id
        self._headers["Mcp-Session-Id"] = session_id
        self._headers["MCP-Protocol-Version"] = LEGACY_VERSION
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        async with self._http.post(self._url, data=note, headers=self._headers) as response:
            await response.read()
            if response.status != 202:
                raise CallFailed(f"notifications/initialized answered {response.status}")

    async def call(self) -> None:
        request_id = next(self._ids)
        params: dict[str, Any] = {"name": self._tool, "arguments": self._args}
        if self._era != "legacy":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "bench-raw", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
        async with self._http.post(self._url, data=body, headers=self._headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise CallFailed(f"tools/call answered {response.status}: {raw[:300]!r}")
            _check_result(answer(response.headers.get("content-type", ""), raw, request_id), self._expected)

    async def close(self) -> None:
        if self._session_id is None:
            return
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with self._http.delete(self._url, headers=self._headers) as response:
                await response.read()
        self._session_id = None


@contextlib.asynccontextmanager
async def raw_http() -> AsyncIterator[aiohttp.ClientSession]:
    # Below uvicorn's 5 s keep-alive: a pooled connection the reference already closed would otherwise be
    # reused after a pause between phases and fail with "Server disconnected".
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=3)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield http


@contextlib.asynccontextmanager
async def raw_callers(http: aiohttp.ClientSession, target: Target, era: str, n: int) -> AsyncIterator[list[RawCaller]]:
    callers = [RawCaller(http, target, era) for _ in range(n)]
    try:
        await asyncio.gather(*(c.open() for c in callers))
        yield callers
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)


async def sdk_sequential(target: Target, mode: str, warmup: int, n: int) -> list[float]:
    """``n`` sequential ``call_tool`` with the SDK client after ``warmup`` calls; latencies in ms."""
    samples: list[float] = []
    async with (
        httpx2.AsyncClient(headers=target.headers, timeout=30) as http,
        Client(streamable_http_client(target.url, http_client=http), mode=mode) as client,
    ):

        async def call() -> None:
            result = await client.call_tool(TOOL, ARGS)
            text = getattr(result.content[0], "text", None) if result.content else None
            if result.is_error or unfenced(text) != EXPECTED_TEXT:
                raise CallFailed(f"SDK call_tool({mode}) failed on {target.name}: {result}")

        await timed(call, warmup, [])
        await timed(call, n, samples)
    return samples


async def raw_sequential(http: aiohttp.ClientSession, target: Target, era: str, warmup: int, n: int) -> list[float]:
    samples: list[float] = []
    async with raw_callers(http, target, era, 1) as (caller,):
        await timed(caller.call, warmup, [])
        await timed(caller.call, n, samples)
    return samples


async def raw_concurrent(
    http: aiohttp.ClientSession, target: Target, era: str, callers: int, total: int, warmup: int
) -> tuple[float, list[float], float]:
    """``callers`` raw clients calling at once, ``total`` calls overall.

    Returns (calls/s, latencies in ms, server CPU ms per call). The last is the least sensitive to
    other load on the machine: it is what one call costs the server, whoever else runs.
    """
    per_caller = max(1, total // callers)
    samples: list[float] = []
    async with raw_callers(http, target, era, callers) as group:
        await asyncio.gather(*(timed(c.call, max(1, warmup // callers), []) for c in group))
        cpu = target.cpu_seconds()
        start = time.perf_counter()
        await asyncio.gather(*(timed(c.call, per_caller, samples) for c in group))
        wall = time.perf_counter() - start
        cpu = target.cpu_seconds() - cpu
    calls = per_caller * callers
    return calls / wall, samples, cpu * 1000.0 / calls


# --------------------------------------------------------------------------------------------------
# Measurement plan and results
# --------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    seq_calls: int
    seq_warmup: int
    conc_rounds: int
    conc_calls: int
    rss_calls: int
    rss_callers: int = 8


QUICK = Plan(rounds=2, seq_calls=60, seq_warmup=10, conc_rounds=1, conc_calls=320, rss_calls=1000)
FULL = Plan(rounds=5, seq_calls=400, seq_warmup=50, conc_rounds=3, conc_calls=1600, rss_calls=20_000)


@dataclass
class Metric:
    """One row: per-round values for each server."""

    label: str
    kind: str  # "latency" (lower is better) | "rate" (higher is better)
    rounds: dict[str, list[float]] = field(default_factory=lambda: {"sidecar": [], "reference": []})
    pooled: dict[str, list[float]] = field(default_factory=lambda: {"sidecar": [], "reference": []})
    target: bool = False

    def add_latencies(self, server: str, samples: list[float]) -> None:
        self.rounds[server].append(statistics.median(samples))
        self.pooled[server].extend(samples)

    def add_rate(self, server: str, rate: float) -> None:
        self.rounds[server].append(rate)

    def value(self, server: str) -> float:
        return statistics.median(self.rounds[server])

    def p95(self, server: str) -> float | None:
        samples = sorted(self.pooled[server])
        return samples[int(0.95 * (len(samples) - 1))] if samples else None

    def ratio(self) -> float:
        return self.value("sidecar") / self.value("reference")

    def verdict(self) -> str:
        if not self.target:
            return ""
        ok = self.ratio() <= 1.0 if self.kind == "latency" else self.ratio() >= 1.0
        return "PASS" if ok else "MISS"


def _orders(rounds: int) -> Iterator[tuple[int, tuple[str, str]]]:
    for r in range(rounds):
        yield r, (("sidecar", "reference") if r % 2 == 0 else ("reference", "sidecar"))


async def run_benchmark(plan: Plan, targets: dict[str, Target]) -> tuple[list[Metric], dict[str, Any]]:
    sdk = {
        "legacy": Metric("sdk-legacy (2025-11-25) median ms", "latency", target=True),
        "auto": Metric("sdk-auto (2026-07-28) median ms", "latency", target=True),
    }
    raw = {
        "legacy": Metric("raw-legacy (2025-11-25) median ms", "latency", target=True),
        "modern": Metric("raw-modern (2026-07-28) median ms", "latency", target=True),
    }
    conc_rate: dict[tuple[str, int], Metric] = {}
    conc_lat: dict[tuple[str, int], Metric] = {}
    server_cpu = {era: Metric(f"raw-{era} server CPU ms/call (all levels)", "latency") for era in ("legacy", "modern")}
    for era in ("legacy", "modern"):
        for level in LEVELS:
            conc_rate[era, level] = Metric(f"raw-{era} x{level} calls/s", "rate", target=level == 32)
            conc_lat[era, level] = Metric(f"raw-{era} x{level} median ms", "latency")

    async with raw_http() as http:
        log(f"sequential: {plan.rounds} rounds x {plan.seq_calls} calls (+{plan.seq_warmup} warm-up) per client")
        for r, order in _orders(plan.rounds):
            for server in order:
                target = targets[server]
                for mode, metric in sdk.items():
                    metric.add_latencies(server, await sdk_sequential(target, mode, plan.seq_warmup, plan.seq_calls))
                for era, metric in raw.items():
                    metric.add_latencies(
                        server, await raw_sequential(http, target, era, plan.seq_warmup, plan.seq_calls)
                    )
            log(
                f"  round {r + 1}/{plan.rounds}: sdk-legacy {sdk['legacy'].rounds['sidecar'][-1]:.2f} vs "
                f"{sdk['legacy'].rounds['reference'][-1]:.2f} ms, raw-legacy {raw['legacy'].rounds['sidecar'][-1]:.2f}"
                f" vs {raw['legacy'].rounds['reference'][-1]:.2f} ms"
            )

        log(f"concurrency {LEVELS}: {plan.conc_rounds} rounds x {plan.conc_calls} calls per level and era")
        for r, order in _orders(plan.conc_rounds):
            for era in ("legacy", "modern"):
                for level in LEVELS:
                    for server in order:
                        rate, samples, cpu = await raw_concurrent(
                            http, targets[server], era, level, plan.conc_calls, warmup=max(level * 2, 20)
                        )
                        server_cpu[era].rounds[server].append(cpu)
                        conc_rate[era, level].add_rate(server, rate)
                        conc_lat[era, level].add_latencies(server, samples)
            log(
                f"  round {r + 1}/{plan.conc_rounds}: legacy x32 {conc_rate['legacy', 32].rounds['sidecar'][-1]:.0f}"
                f" vs {conc_rate['legacy', 32].rounds['reference'][-1]:.0f} calls/s"
            )

        memory = await measure_rss(http, plan, targets)

    metrics = [*sdk.values(), *raw.values()]
    for era in ("legacy", "modern"):
        for level in LEVELS:
            metrics += [conc_rate[era, level], conc_lat[era, level]]
    metrics += server_cpu.values()
    return metrics, memory


async def measure_rss(http: aiohttp.ClientSession, plan: Plan, targets: dict[str, Target]) -> dict[str, Any]:
    target = targets["sidecar"]
    half = plan.rss_callers // 2
    log(f"RSS: {plan.rss_calls} raw calls, {plan.rss_callers} callers ({half} legacy, {half} modern)")
    async with (
        raw_callers(http, target, "legacy", half) as legacy,
        raw_callers(http, target, "modern", plan.rss_callers - half) as modern,
    ):
        group = legacy + modern
        await asyncio.gather(*(timed(c.call, 100, []) for c in group))
        await asyncio.sleep(1.0)
        before = target.rss_mb()
        per_caller = plan.rss_calls // len(group)
        start = time.perf_counter()
        await asyncio.gather(*(timed(c.call, per_caller, []) for c in group))
        wall = time.perf_counter() - start
        await asyncio.sleep(1.0)
        after = target.rss_mb()
    return {
        "before_mb": before,
        "after_mb": after,
        "calls": per_caller * len(group),
        "rate": per_caller * len(group) / wall,
        "growth_pct": (after - before) / before * 100.0,
    }


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def render(metrics: list[Metric], memory: dict[str, Any], idle: dict[str, float], plan: Plan, name: str) -> str:
    rows: list[tuple[str, ...]] = [("metric", "sidecar", "reference", "ratio s/r", "target")]
    for m in metrics:
        fmt = "{:.0f}" if m.kind == "rate" else "{:.2f}"
        cells = []
        for server in ("sidecar", "reference"):
            text = fmt.format(m.value(server))
            if m.kind == "latency" and (p95 := m.p95(server)) is not None:
                text += f" (p95 {p95:.2f})"
            cells.append(text)
        goal = ""
        if m.target:
            goal = f"{m.verdict()} ({'<=' if m.kind == 'latency' else '>='} 1.00)"
        rows.append((m.label, *cells, f"{m.ratio():.2f}", goal))
    rows.append(
        (
            "idle RSS MB (after start)",
            f"{idle['sidecar']:.1f}",
            f"{idle['reference']:.1f}",
            f"{idle['sidecar'] / idle['reference']:.2f}",
            f"{'PASS' if idle['sidecar'] < IDLE_RSS_LIMIT_MB else 'MISS'} (< {IDLE_RSS_LIMIT_MB:.0f} MB)",
        )
    )
    growth_ok = memory["growth_pct"] <= RSS_GROWTH_LIMIT_PCT
    short = memory["calls"] < 20_000
    rows.append(
        (
            f"RSS growth over {memory['calls']} calls",
            f"{memory['before_mb']:.1f} -> {memory['after_mb']:.1f} MB ({memory['growth_pct']:+.1f}%)",
            "-",
            "-",
            f"{'PASS' if growth_ok else 'MISS'} (<= {RSS_GROWTH_LIMIT_PCT:.0f}%)" + (" [short run]" if short else ""),
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        f"sidecar /mcp vs MCP SDK {_sdk_version()} reference (uvicorn) - {name} run: "
        f"{plan.rounds} rounds x {plan.seq_calls} sequential calls, {plan.conc_rounds} x {plan.conc_calls} "
        f"per concurrency level; figures are medians over rounds (min-max in JSON output)",
    ]
    for i, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    misses = [r[0] for r in rows[1:] if r[-1].startswith("MISS")]
    lines.append("")
    lines.append("ALL TARGETS MET" if not misses else f"MISSED: {', '.join(misses)}")
    lines.append(
        f"(RSS run throughput: {memory['rate']:.0f} calls/s; ratio = sidecar / reference for latency "
        "and throughput alike: latency wants <= 1, throughput >= 1)"
    )
    return "\n".join(lines)


def _sdk_version() -> str:
    from importlib.metadata import version

    return version("mcp")


def as_json(metrics: list[Metric], memory: dict[str, Any], idle: dict[str, float]) -> dict[str, Any]:
    return {
        "metrics": [
            {
                "label": m.label,
                "kind": m.kind,
                "ratio": m.ratio(),
                "verdict": m.verdict() or None,
                **{s: {"value": m.value(s), "rounds": m.rounds[s], "p95": m.p95(s)} for s in ("sidecar", "reference")},
            }
            for m in metrics
        ],
        "idle_rss_mb": idle,
        "rss_growth": memory,
    }


# --------------------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {
        key: getattr(args, key)
        for key in ("rounds", "seq_calls", "conc_rounds", "conc_calls", "rss_calls")
        if getattr(args, key) is not None
    }
    plan = dataclasses.replace(QUICK if args.quick else FULL, **overrides)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        workspace = workdir / "workspace"
        workspace.mkdir()
        sc_proc, runtime = stack.enter_context(sidecar_process(workdir, args.profile_sidecar))
        ref_proc, ref_port = stack.enter_context(reference_process(workdir))
        await asyncio.sleep(1.0)  # let both settle before the idle reading
        idle = {
            "sidecar": psutil.Process(sc_proc.pid).memory_info().rss / 2**20,
            "reference": psutil.Process(ref_proc.pid).memory_info().rss / 2**20,
        }
        session = await create_sidecar_session(runtime, workspace)
        targets = {
            "sidecar": Target("sidecar", session["url"], dict(session["headers"]), sc_proc),
            "reference": Target("reference", f"http://127.0.0.1:{ref_port}/mcp", {}, ref_proc),
        }
        log(f"sidecar pid {sc_proc.pid} at {session['url']}; reference pid {ref_proc.pid} on port {ref_port}")
        try:
            metrics, memory = await run_benchmark(plan, targets)
        finally:
            for name, target in targets.items():
                if target.proc.poll() is not None:
                    log(f"{name} died during the benchmark (exit {target.proc.returncode}):")
                    log(tail(workdir / f"{name}.stderr"))
        for name, target in targets.items():
            if target.proc.poll() is not None:
                raise RuntimeError(f"{name} died during the benchmark (exit {target.proc.returncode})")
    print(render(metrics, memory, idle, plan, "quick" if args.quick else "full"), flush=True)
    log(f"done in {time.monotonic() - started:.0f}s")
    return as_json(metrics, memory, idle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of ~30 s")
    parser.add_argument("--rounds", type=int, help="rounds of sequential measurements")
    parser.add_argument("--seq-calls", type=int, help="sequential calls per client per round")
    parser.add_argument("--conc-rounds", type=int, help="rounds of concurrency measurements")
    parser.add_argument("--conc-calls", type=int, help="calls per concurrency level per round")
    parser.add_argument("--rss-calls", type=int, help="calls of the RSS growth run (target: 20000)")
    parser.add_argument(
        "--profile-sidecar",
        metavar="PATH",
        help="run the daemon under cProfile and write its stats to PATH (figures are then slower)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure (and per-round values) as JSON")
    args = parser.parse_args(argv)
    if args.profile_sidecar:
        args.profile_sidecar = os.path.abspath(args.profile_sidecar)  # the daemon runs in a temp cwd
    try:
        results = asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130
    if args.json:
        Path(args.json).writeunfenced(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
