"""Benchmark: the proxied ``tools/call`` side by side with the peers, in one run, with every ratio of issue 15.

One stdio MCP server, ``tests/connectors/fixtures/echo_server.py`` (tool ``echo(text)``), behind each path:

* **direct**: this process spawns the fixture and talks to it over stdio (raw: hand-written JSON-RPC lines;
  SDK: ``Client(StdioServerParameters)``). No HTTP: the floor.
* **sdk-http**: ``scripts/bench_reference_server.py --echo``, the SDK's own Streamable HTTP server (uvicorn)
  serving ``echo`` itself, and ``calculate`` for the built-in row.
* **supergateway** (npm 4.0, ``--stateful``, stdio to Streamable HTTP; installed on first run into
  ``.bench/supergateway``) and **mcp-proxy** (PyPI, in its own venv ``.bench/mcp-proxy-venv``: it needs
  ``mcp<2``). A peer that cannot be installed or started is left out with a note.
* **sidecar /mcp**: ``python -OO -m sidecar serve`` with the fixture trusted as user connector ``echo``, a
  ``bypass`` session allowed ``*``: ``mcp__echo__echo`` through the guard, route token, envelope, the one
  decision, argument checks, audit and the session's connector process.
* **sidecar route**: the same connector on its own route ``/mcp/connectors/echo`` (the faithful relay),
  tool ``echo``.

Clients: **raw** (aiohttp, hand-built JSON-RPC; a 2025-era caller holds an MCP session of its own) and the
**SDK** (``mcp.Client``). Eras: 2025-11-25 everywhere; 2026-07-28 where the server speaks it (sidecar and
the SDK's server; the peers do not, so 2026-07-28 figures are compared with the peers' 2025 ones).

Measured, in one run: sequential ``tools/call`` p50 (rounds alternate the order of the paths; the figure
is the median of the per-round medians); 8 and 32 concurrent raw callers (calls/s and p99); the built-in
``calculate`` through ``/mcp`` next to the SDK's server; the daemon's idle RSS after start; a new
session's cold first call next to a bare spawn + initialize + call. Then each target ratio, PASS or MISS.
Under concurrency each row also gives the CPU per call (psutil, user + system) of the client, the server
process and its descendants (the connector): with every process on the same two cores, throughput is
bound by their sum, and the connector and client are the same behind every server.
Compare within one run only: this machine moves ±20-30 % between runs.

    .venv/bin/python scripts/bench_peers.py            # full run (several minutes)
    .venv/bin/python scripts/bench_peers.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import bench_connectors as bc  # scripts/ is sys.path[0]
import psutil
from bench_mcp import RawCaller, Target, raw_http, reference_process
from benchlib import CallFailed, log, stop, timed, wait_ready

ROOT = Path(__file__).resolve().parent.parent
SUPERGATEWAY_DIR = ROOT / ".bench" / "supergateway"
SUPERGATEWAY_VERSION = "4.0.0"
LEGACY, MODERN = "2025-11-25", "2026-07-28"
ERAS = {LEGACY: "legacy", MODERN: "modern"}  # bench_mcp's names for the raw caller
ECHO = ("echo", {"text": "x"}, "x")
LEVELS = (8, 32)

VS_MCP_PROXY = 0.6
VS_SUPERGATEWAY = 0.75
OVER_DIRECT_MS = 1.0
THROUGHPUT_VS_MCP_PROXY = 1.5
BUILTIN_VS_SDK = 1.0
IDLE_RSS_MB = 80.0
COLD_VS_BARE = 1.2


@dataclass(frozen=True)
class Path_:
    """One way to the echo tool (``url`` None: direct stdio)."""

    name: str
    url: str | None
    tool: str = "echo"
    headers: dict[str, str] = field(default_factory=dict)
    eras: tuple[str, ...] = (LEGACY,)
    arguments: dict[str, Any] = field(default_factory=lambda: dict(ECHO[1]))
    expected: str = ECHO[2]
    server_pid: int | None = None
    """The server's process: its CPU, and its descendants' (the connector), are counted under load."""


@dataclass
class Plan:
    rounds: int
    seq_calls: int
    warmup: int
    conc_calls: int
    cold_reps: int


QUICK = Plan(rounds=2, seq_calls=60, warmup=15, conc_calls=480, cold_reps=3)
FULL = Plan(rounds=5, seq_calls=300, warmup=40, conc_calls=1920, cold_reps=5)


# --------------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------------


def ensure_supergateway() -> tuple[Path | None, str]:
    exe = SUPERGATEWAY_DIR / "node_modules" / ".bin" / "supergateway"
    if exe.exists():
        return exe, ""
    log(f"installing supergateway {SUPERGATEWAY_VERSION} into {SUPERGATEWAY_DIR} (first run only)")
    try:
        SUPERGATEWAY_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(SUPERGATEWAY_DIR),
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                f"supergateway@{SUPERGATEWAY_VERSION}",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"supergateway install failed: {exc}"
    return (exe, "") if exe.exists() else (None, "supergateway installed but no .bin/supergateway")


@contextlib.contextmanager
def supergateway_process(exe: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = bc._free_port()
    errfile = workdir / "supergateway.stderr"
    with errfile.open("wb") as errlog:
        proc = subprocess.Popen(
            [
                str(exe),
                "--stdio",
                f"{sys.executable} {bc.ECHO_SERVER}",
                "--outputTransport",
                "streamableHttp",
                "--stateful",
                "--port",
                str(port),
                "--logLevel",
                "none",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errlog,
            cwd=workdir,
            start_new_session=True,
        )

        def listening() -> bool | None:
            with contextlib.suppress(OSError), bc.socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
            return None

        try:
            wait_ready(proc, "supergateway", errfile, f"listen on {port}", listening)
            yield proc, f"http://127.0.0.1:{port}/mcp"
        finally:
            stop(proc, "supergateway", group=True)


# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


class StdioRaw:
    """Hand-written JSON-RPC lines to the fixture's stdin, one call at a time: the raw direct client."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = 0

    async def __aenter__(self) -> StdioRaw:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(bc.ECHO_SERVER),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            limit=2**22,
        )
        init = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench-raw", "version": "1"}}
        await self._request("initialize", init)
        self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    def _write(self, message: dict[str, Any]) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise CallFailed("the direct server is not running")
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._proc is None or self._proc.stdout is None:
            raise CallFailed("the direct server is not running")
        self._ids += 1
        self._write({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params})
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                raise CallFailed("the direct server closed stdout")
            message = json.loads(line)
            if message.get("id") == self._ids:
                if not isinstance(message.get("result"), dict):
                    raise CallFailed(f"{method} failed: {line[:300]!r}")
                return message["result"]  # type: ignore[no-any-return]

    async def call(self) -> None:
        result = await self._request("tools/call", {"name": ECHO[0], "arguments": ECHO[1]})
        if result.get("isError") or (result.get("content") or [{}])[0].get("text") != ECHO[2]:
            raise CallFailed(f"direct echo failed: {result}")


@contextlib.asynccontextmanager
async def raw_client(
    http: aiohttp.ClientSession, path: Path_, era: str
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    if path.url is None:
        async with StdioRaw() as direct:
            yield direct.call
        return
    caller = RawCaller(http, _target(path), ERAS[era], (path.tool, path.arguments, path.expected))
    await caller.open()
    try:
        yield caller.call
    finally:
        await caller.close()


@contextlib.asynccontextmanager
async def sdk_client(path: Path_, era: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    endpoint = bc.Endpoint(
        path.name,
        path.tool,
        path.url,
        path.headers,
        path.arguments,
        path.expected,
        mode="legacy" if era == LEGACY else era,
    )
    async with endpoint.client() as client:

        async def call() -> None:
            await bc.echo_call(client, path.tool, path.arguments, path.expected)

        yield call


def _target(path: Path_) -> Target:
    return Target(path.name, path.url or "", dict(path.headers), None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------

Key = tuple[str, str, str]  # (path, client, era)


@dataclass
class Results:
    p50: dict[Key, list[float]] = field(default_factory=dict)  # per-round medians
    rate: dict[tuple[str, str, int], float] = field(default_factory=dict)  # (path, era, callers)
    p99: dict[tuple[str, str, int], float] = field(default_factory=dict)
    cpu: dict[tuple[str, str, int], tuple[float, float, float]] = field(default_factory=dict)
    """(client, server, its descendants) CPU ms per call under load."""
    idle_rss: float = float("nan")
    cold: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def sequential(http: aiohttp.ClientSession, paths: list[Path_], plan: Plan, res: Results) -> None:
    keys = [(p, client, era) for p in paths for client in ("raw", "sdk") for era in p.eras]
    log(f"sequential tools/call: {plan.rounds} rounds x {plan.seq_calls} calls on {len(keys)} (path, client, era)")
    for r in range(plan.rounds):
        order = keys if r % 2 == 0 else keys[::-1]
        for path, client, era in order:
            opened = raw_client(http, path, era) if client == "raw" else sdk_client(path, era)
            samples: list[float] = []
            async with opened as call:
                await timed(call, plan.warmup, [])
                await timed(call, plan.seq_calls, samples)
            res.p50.setdefault((path.name, client, era), []).append(statistics.median(samples))
        log(f"  round {r + 1}/{plan.rounds} done")


async def concurrent(http: aiohttp.ClientSession, paths: list[Path_], plan: Plan, res: Results) -> None:
    for callers in LEVELS:
        for path in paths:
            for era in path.eras:
                if path.url is None or (path.name == "sidecar route" and era == LEGACY):
                    continue  # direct: one pipe; the route gives each 2025-era MCP session a process of its own
                per_caller = max(1, plan.conc_calls // callers)
                samples: list[float] = []
                async with contextlib.AsyncExitStack() as stack:
                    calls = [await stack.enter_async_context(raw_client(http, path, era)) for _ in range(callers)]
                    await asyncio.gather(*(timed(c, max(2, plan.warmup // 4), []) for c in calls))
                    groups = _process_groups(path.server_pid)
                    before = [_cpu_seconds(g) for g in groups]
                    start = time.perf_counter()
                    await asyncio.gather(*(timed(c, per_caller, samples) for c in calls))
                    wall = time.perf_counter() - start
                    spent = [_cpu_seconds(g) - b for g, b in zip(groups, before, strict=True)]
                res.rate[(path.name, era, callers)] = per_caller * callers / wall
                res.p99[(path.name, era, callers)] = _pct(samples, 0.99)
                per_call = [seconds * 1000 / (per_caller * callers) for seconds in spent]
                res.cpu[(path.name, era, callers)] = (per_call[0], per_call[1], per_call[2])
                log(f"  {callers} callers, {path.name} {era}: {res.rate[(path.name, era, callers)]:.0f} calls/s")


async def cold(http: aiohttp.ClientSession, daemon: bc.Daemon, plan: Plan, res: Results) -> None:
    shim = bc.Results()
    await bc.phase_cold(bc.dataclasses.replace(bc.QUICK, cold_reps=plan.cold_reps), daemon, http, shim)
    res.cold, res.bare = shim.cold_sidecar, shim.cold_bare


def _process_groups(server_pid: int | None) -> list[list[psutil.Process]]:
    """[this client], [the server], [the server's descendants now: its connector processes]."""
    if server_pid is None:
        return [[psutil.Process()], [], []]
    server = psutil.Process(server_pid)
    return [[psutil.Process()], [server], server.children(recursive=True)]


def _cpu_seconds(group: list[psutil.Process]) -> float:
    """User + system CPU of the processes still running (one that ended meanwhile counts nothing)."""
    total = 0.0
    for proc in group:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else float("nan")


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def render(res: Results, plan: Plan, run: str, versions: dict[str, str]) -> str:
    p50 = {key: statistics.median(values) for key, values in res.p50.items()}
    out = [
        f"issue 15 side by side - {run} run: {plan.rounds} rounds x {plan.seq_calls} sequential calls; "
        f"{plan.conc_calls} calls per concurrency level; peers: "
        + (", ".join(f"{k} {v}" for k, v in versions.items()) or "none"),
        "",
        "sequential tools/call p50, ms (median of per-round medians):",
    ]
    names = sorted({k[0] for k in p50}, key=lambda n: list(dict.fromkeys(k[0] for k in res.p50)).index(n))
    for name in names:
        cells = [
            f"{client} {era}: {p50[(name, client, era)]:.2f}"
            for client in ("raw", "sdk")
            for era in (LEGACY, MODERN)
            if (name, client, era) in p50
        ]
        out.append(f"  {name:24s} " + "   ".join(cells))
    rows: list[tuple[str, float, str, bool]] = []

    def ratio(label: str, value: float, limit: float, *, at_most: bool = True) -> None:
        ok = value <= limit if at_most else value >= limit
        rows.append((label, value, f"{'<=' if at_most else '>='} {limit}", ok))

    for sidecar in ("sidecar /mcp", "sidecar route"):
        for client in ("raw", "sdk"):
            for era in (LEGACY, MODERN):
                mine = p50.get((sidecar, client, era))
                if mine is None:
                    continue
                for peer, limit in (("mcp-proxy", VS_MCP_PROXY), ("supergateway", VS_SUPERGATEWAY)):
                    theirs = p50.get((peer, client, LEGACY))
                    if theirs is not None:
                        ratio(f"{sidecar} {client} {era} p50 / {peer} ({theirs:.2f} ms)", mine / theirs, limit)
                direct = p50.get(("direct", "raw", LEGACY))
                if client == "raw" and direct is not None:
                    ratio(f"{sidecar} raw {era} p50 - direct raw ({direct:.2f} ms), ms", mine - direct, OVER_DIRECT_MS)
    for callers in LEVELS:
        theirs_rate = res.rate.get(("mcp-proxy", LEGACY, callers))
        theirs_p99 = res.p99.get(("mcp-proxy", LEGACY, callers))
        for (name, era, level), rate in res.rate.items():
            if level != callers or not name.startswith("sidecar") or theirs_rate is None or theirs_p99 is None:
                continue
            ratio(
                f"{name} {era} x{callers}: {rate:.0f} calls/s / mcp-proxy {theirs_rate:.0f}",
                rate / theirs_rate,
                THROUGHPUT_VS_MCP_PROXY,
                at_most=False,
            )
            ratio(
                f"{name} {era} x{callers}: p99 {res.p99[(name, era, level)]:.2f} ms / mcp-proxy {theirs_p99:.2f}",
                res.p99[(name, era, level)] / theirs_p99,
                1.0,
            )
    for client in ("raw", "sdk"):
        for era in (LEGACY, MODERN):
            mine, theirs = p50.get(("sidecar calculate", client, era)), p50.get(("sdk-http calculate", client, era))
            if mine is not None and theirs is not None:
                ratio(
                    f"built-in calculate {client} {era}: {mine:.2f} / SDK server {theirs:.2f} ms",
                    mine / theirs,
                    BUILTIN_VS_SDK,
                )
    ratio("idle RSS after start, MB", res.idle_rss, IDLE_RSS_MB)
    if res.cold and res.bare:
        cold_ms, bare_ms = statistics.median(res.cold), statistics.median(res.bare)
        ratio(
            f"cold first call {cold_ms:.0f} ms / bare spawn+init+call {bare_ms:.0f} ms", cold_ms / bare_ms, COLD_VS_BARE
        )
    out += ["", "concurrent raw callers (calls/s, p99 ms; CPU ms per call of the client / server / connector):"]
    for (name, era, callers), rate in res.rate.items():
        client, server, connector = res.cpu[(name, era, callers)]
        out.append(
            f"  x{callers:<3d} {name:24s} {era}: {rate:6.0f} calls/s  p99 {res.p99[(name, era, callers)]:6.2f}"
            f"  cpu {client:.2f} / {server:.2f} / {connector:.2f}"
        )
    out += ["", "targets:"]
    width = max(len(r[0]) for r in rows)
    for label, value, target, ok in rows:
        out.append(f"  {label.ljust(width)}  {value:7.2f}  {target:8s} {'PASS' if ok else 'MISS'}")
    misses = sum(1 for r in rows if not r[3])
    out += ["", "ALL TARGETS MET" if not misses else f"{misses} of {len(rows)} targets missed"]
    out += [f"note: {n}" for n in res.notes]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan.rounds = args.rounds
    res = Results()
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-peers-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        daemon = stack.enter_context(bc.sidecar_process(workdir))
        await asyncio.sleep(1.0)
        res.idle_rss = daemon.rss_mb()
        ref_proc, ref_port = stack.enter_context(reference_process(workdir, "--echo"))
        ref_url = f"http://127.0.0.1:{ref_port}/mcp"
        paths = [
            Path_("direct", None),
            Path_("sdk-http", ref_url, eras=(LEGACY, MODERN), server_pid=ref_proc.pid),
        ]
        proxy_exe, why = bc.ensure_mcp_proxy()
        if proxy_exe is not None:
            try:
                proxy_proc, proxy_url = stack.enter_context(bc.mcp_proxy_process(proxy_exe, workdir))
                paths.append(Path_("mcp-proxy", proxy_url, server_pid=proxy_proc.pid))
                versions["mcp-proxy"] = bc._mcp_proxy_version(proxy_exe)
            except Exception as exc:
                res.notes.append(f"mcp-proxy left out: {exc}"[:300])
        else:
            res.notes.append(f"mcp-proxy left out: {why}")
        gateway, why = ensure_supergateway()
        if gateway is not None:
            try:
                gateway_proc, gateway_url = stack.enter_context(supergateway_process(gateway, workdir))
                paths.append(Path_("supergateway", gateway_url, server_pid=gateway_proc.pid))
                versions["supergateway"] = SUPERGATEWAY_VERSION
            except Exception as exc:
                res.notes.append(f"supergateway left out: {exc}"[:300])
        else:
            res.notes.append(f"supergateway left out: {why}")
        async with raw_http() as http:
            bc.write_user_servers(daemon, ["echo"])
            await bc.trust(http, daemon, "echo")
            session = await daemon.new_session(http)
            routed = await daemon.control(
                http,
                "POST",
                "/control/sessions",
                {"workspace": str(daemon.workspace), "mode": "bypass", "connector": "echo"},
            )
            both = (LEGACY, MODERN)
            pid: dict[str, Any] = {"server_pid": daemon.pid}
            paths += [
                Path_("sidecar /mcp", session["url"], "mcp__echo__echo", dict(session["headers"]), both, **pid),
                Path_("sidecar route", routed["url"], "echo", dict(routed["headers"]), both, **pid),
            ]
            calc = {"tool": "calculate", "arguments": {"expression": "1+1"}, "expected": "2", "eras": both}
            builtins = [
                Path_("sidecar calculate", session["url"], headers=dict(session["headers"]), **calc),  # type: ignore[arg-type]
                Path_("sdk-http calculate", ref_url, **calc),  # type: ignore[arg-type]
            ]
            for path in paths:  # every path answers before anything is timed
                async with raw_client(http, path, LEGACY) as call:
                    await call()
            await sequential(http, paths + builtins, plan, res)
            log(f"concurrent raw callers: {', '.join(map(str, LEVELS))}")
            await concurrent(http, paths, plan, res)
            await daemon.end_session(http, session)
            await daemon.end_session(http, routed)
            await cold(http, daemon, plan, res)
        if daemon.proc.poll() is not None or ref_proc.poll() is not None:
            raise RuntimeError("a server died during the benchmark")
        res.notes.append(f"daemon RSS at the end: {daemon.rss_mb():.1f} MB; children now {len(daemon.children())}")
    print(render(res, plan, "quick" if args.quick else "full", versions), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_peers.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds of sequential measurements")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
