"""Benchmark: connector tools proxied through the sidecar's ``/mcp`` next to a direct client and ``mcp-proxy``.

One stdio MCP server (``tests/connectors/fixtures/echo_server.py``, tool ``echo(text)``) is reached three ways,
all with the same SDK client code (``mcp.Client``, ``mode="legacy"``) in this process:

* **direct**: ``Client(StdioServerParameters(python echo_server.py))``: the client spawns the server itself.
* **sidecar**: ``python -m sidecar serve --port 0`` (throw-away ``SIDECAR_HOME``) with the server trusted as the
  user connector ``echo``; a ``bypass`` session from the control API; the tool is ``mcp__echo__echo`` on ``/mcp``
  (Host/Origin guard, route token, session envelope, policy and the per-session connector process all on the path).
* **mcp-proxy** (PyPI, needs ``mcp<2``: installed on first run into ``.bench/mcp-proxy-venv``):
  ``mcp-proxy --port P -- python echo_server.py``, Streamable HTTP on ``/mcp``. Skipped with a note if it
  cannot be installed.

Measured, in one run:

1. ``tools/call`` median latency (sequential, after a warm-up) and throughput with 8 concurrent callers sharing
   one client, per path; rounds alternate the order of the paths; figures are medians over rounds. An
   information row times the built-in ``calculate`` on the same sidecar session: the HTTP + daemon floor
   without a connector behind it.
2. Cold first call: a new sidecar session's first ``mcp__echo__echo`` (the connector process is spawned on it)
   next to a bare ``Client(StdioServerParameters)`` open + initialize + one call.
3. ``tools/list`` on a brand-new session with 10 trusted connectors (``echo0``..``echo9``), one raw 2026-07-28
   POST; psutil checks that the daemon started no process while answering. The daemon runs with
   ``[tools] auto_defer_above = 1000`` so that all 60 connector tools are listed, not auto-deferred.
4. N sessions (200 in a full run) each created, used for one call and ended; then (bounded wait) the daemon's
   child process count must be back to its baseline, and its RSS must not have grown more than 10 %.

Targets (ratios within this run): proxied median <= 1.6x direct and <= 0.5x mcp-proxy; 8-caller throughput
>= 0.8x direct; cold first call <= 1.2x bare spawn + initialize; new-session tools/list < 20 ms; no leaked
process.

    .venv/bin/python scripts/bench_connectors.py            # full run (a few minutes)
    .venv/bin/python scripts/bench_connectors.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import socket
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
    CallFailed,
    answer,
    control_call,
    log,
    sidecar_daemon,
    stop,
    timed,
    unfenced,
    wait_ready,
)
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
ECHO_SERVER = ROOT / "tests" / "connectors" / "fixtures" / "echo_server.py"
PROXY_VENV = ROOT / ".bench" / "mcp-proxy-venv"

MODERN_VERSION = "2026-07-28"
SETTLE_TIMEOUT = 30.0
CALLERS = 8
CONNECTORS = 10
# Raised from the shipped 64 so that the new-session tools/list carries every connector tool (10 x 6) rather
# than the three meta-tools of an auto-deferred session: the costlier, honest case for the 20 ms target.
AUTO_DEFER_ABOVE = 1000

LATENCY_VS_DIRECT = 1.6
LATENCY_VS_PROXY = 0.5
THROUGHPUT_VS_DIRECT = 0.8
COLD_VS_BARE = 1.2
LIST_LIMIT_MS = 20.0
RSS_GROWTH_LIMIT_PCT = 10.0

PATHS_UNDER_TEST = ("sidecar", "direct", "mcp-proxy")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------------


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    url: str
    control_token: str
    config_dir: Path
    workspace: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def children(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    async def control(self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None) -> Any:
        return await control_call(http, self.url, self.control_token, method, path, body)

    async def new_session(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        body = {"workspace": str(self.workspace), "project": "bench", "mode": "bypass", "allow": ["*"]}
        return await self.control(http, "POST", "/control/sessions", body)  # type: ignore[no-any-return]

    async def end_session(self, http: aiohttp.ClientSession, session: dict[str, Any]) -> None:
        await self.control(http, "DELETE", f"/control/sessions/{session['session_id']}")

    async def settle(self, baseline: set[int] | None = None) -> bool:
        """Wait (bounded by ``SETTLE_TIMEOUT``) until the daemon has no child beyond ``baseline``."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        base = baseline or set()
        while time.monotonic() < deadline:
            if not self.children() - base:
                return True
            await asyncio.sleep(0.05)
        return False


@contextlib.contextmanager
def sidecar_process(workdir: Path) -> Iterator[Daemon]:
    from sidecar.paths import Paths

    home = workdir / "home"
    paths = Paths.resolve({"SIDECAR_HOME": str(home)})
    workspace = workdir / "workspace"
    workspace.mkdir()
    paths.config.mkdir(parents=True, exist_ok=True)
    settings = paths.config / "sidecar.toml"
    # Connector tools listed, not deferred: the new-session tools/list row measures listing them.
    settings.write_text(f"[tools]\nauto_defer_above = {AUTO_DEFER_ABOVE}\ndefer_connectors = false\n")
    settings.chmod(0o600)
    with sidecar_daemon(workdir, home) as (proc, runtime):
        yield Daemon(proc, runtime["url"], runtime["control_token"], paths.config, workspace)


def write_user_servers(daemon: Daemon, ids: list[str]) -> None:
    entry = {"command": sys.executable, "args": [str(ECHO_SERVER)]}
    daemon.config_dir.mkdir(parents=True, exist_ok=True)
    path = daemon.config_dir / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {i: dict(entry) for i in ids}}))
    path.chmod(0o600)


async def trust(http: aiohttp.ClientSession, daemon: Daemon, connector: str) -> None:
    shown = await daemon.control(http, "POST", f"/control/connectors/{connector}/trust")
    if shown.get("state") != "trusted" or shown.get("error"):
        raise RuntimeError(f"trusting {connector} failed: {shown}")


# --------------------------------------------------------------------------------------------------
# mcp-proxy
# --------------------------------------------------------------------------------------------------


def ensure_mcp_proxy() -> tuple[Path | None, str]:
    """The ``mcp-proxy`` executable in its own venv (installed on first use), or (None, why not)."""
    exe = PROXY_VENV / "bin" / "mcp-proxy"
    if exe.exists():
        return exe, ""
    log(f"installing mcp-proxy into {PROXY_VENV} (first run only)")
    try:
        PROXY_VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3", "-m", "venv", str(PROXY_VENV)], check=True, capture_output=True, timeout=120)
        subprocess.run(
            [str(PROXY_VENV / "bin" / "pip"), "install", "-q", "mcp-proxy"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return None, f"mcp-proxy install failed: {exc} {detail[-300:].decode(errors='replace')}".strip()
    if not exe.exists():
        return None, "mcp-proxy installed but no bin/mcp-proxy"
    return exe, ""


def _mcp_proxy_version(exe: Path) -> str:
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, timeout=30, check=False)
        line = (out.stdout or out.stderr).decode(errors="replace").strip().splitlines()[-1]
        return line.removeprefix("mcp-proxy").strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


@contextlib.contextmanager
def mcp_proxy_process(exe: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    errfile = workdir / "mcp-proxy.stderr"
    errlog = errfile.open("wb")
    proc = subprocess.Popen(
        [str(exe), "--port", str(port), "--host", "127.0.0.1", "--", sys.executable, str(ECHO_SERVER)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errlog,
        cwd=workdir,
        start_new_session=True,
    )

    def listening() -> bool | None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        return None

    try:
        wait_ready(proc, "mcp-proxy", errfile, f"listen on {port}", listening)
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc, "mcp-proxy", group=True)
        errlog.close()


# --------------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------------


def stdio_params() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(ECHO_SERVER)])


@dataclass
class Endpoint:
    """One path to the echo tool: how to open an SDK client on it and which tool name to call."""

    name: str
    tool: str
    url: str | None = None  # None: direct stdio
    headers: dict[str, str] = field(default_factory=dict)
    arguments: dict[str, Any] = field(default_factory=lambda: {"text": "x"})
    expected: str = "x"
    mode: str = "legacy"  # the SDK client's protocol era: "legacy" (2025-11-25) or "2026-07-28"

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        if self.url is None:
            async with Client(stdio_params(), mode="legacy") as client:
                yield client
            return
        async with (
            httpx2.AsyncClient(headers=self.headers, timeout=60) as http,
            Client(streamable_http_client(self.url, http_client=http), mode=self.mode) as client,
        ):
            yield client


async def echo_call(client: Client, tool: str, arguments: dict[str, Any] | None = None, expected: str = "x") -> None:
    result = await client.call_tool(tool, arguments or {"text": expected})
    got = getattr(result.content[0], "text", None) if result.content else None
    if result.is_error or unfenced(got) != expected:
        raise CallFailed(f"{tool} failed: {result}")


async def measure_calls(endpoint: Endpoint, plan: Plan) -> tuple[list[float], float]:
    """Sequential latencies (ms) and the calls/s of ``CALLERS`` tasks sharing one client."""
    samples: list[float] = []
    async with endpoint.client() as client:

        async def call() -> None:
            await echo_call(client, endpoint.tool, endpoint.arguments, endpoint.expected)

        await timed(call, plan.warmup, [])
        await timed(call, plan.seq_calls, samples)
        per_caller = max(1, plan.conc_calls // CALLERS)
        await asyncio.gather(*(timed(call, max(1, plan.warmup // CALLERS), []) for _ in range(CALLERS)))
        start = time.perf_counter()
        await asyncio.gather(*(timed(call, per_caller, []) for _ in range(CALLERS)))
        rate = per_caller * CALLERS / (time.perf_counter() - start)
    return samples, rate


_ids = itertools.count(1)


async def raw_modern(
    http: aiohttp.ClientSession, session: dict[str, Any], method: str, params: dict[str, Any], name: str | None = None
) -> dict[str, Any]:
    """One 2026-07-28 request: a single POST with the era headers and the ``_meta`` envelope."""
    request_id = next(_ids)
    headers = {
        **session["headers"],
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN_VERSION,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}
    async with http.post(session["url"], data=json.dumps(body), headers=headers) as response:
        raw = await response.read()
        if response.status != 200:
            raise CallFailed(f"{method} answered {response.status}: {raw[:300]!r}")
        message = answer(response.headers.get("content-type", ""), raw, request_id)
    if not isinstance(message.get("result"), dict):
        raise CallFailed(f"{method} failed: {json.dumps(message)[:300]}")
    return message["result"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------------
# Plan and measurements
# --------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    seq_calls: int
    warmup: int
    conc_calls: int
    cold_reps: int
    list_reps: int
    sessions: int
    session_callers: int = 8


QUICK = Plan(rounds=2, seq_calls=100, warmup=20, conc_calls=400, cold_reps=3, list_reps=10, sessions=40)
FULL = Plan(rounds=5, seq_calls=400, warmup=50, conc_calls=1600, cold_reps=7, list_reps=30, sessions=200)


@dataclass
class Results:
    latency: dict[str, list[float]] = field(default_factory=dict)  # per-round medians
    pooled: dict[str, list[float]] = field(default_factory=dict)
    rate: dict[str, list[float]] = field(default_factory=dict)
    cold_sidecar: list[float] = field(default_factory=list)
    cold_session_open: list[float] = field(default_factory=list)
    cold_bare: list[float] = field(default_factory=list)
    list_ms: list[float] = field(default_factory=list)
    list_tools: int = 0
    list_spawned: int = 0
    churn: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


async def phase_calls(plan: Plan, endpoints: dict[str, Endpoint], res: Results) -> None:
    names = list(endpoints)
    log(f"tools/call: {plan.rounds} rounds x {plan.seq_calls} sequential + {plan.conc_calls} with {CALLERS} callers")
    for r in range(plan.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            samples, rate = await measure_calls(endpoints[name], plan)
            res.latency.setdefault(name, []).append(statistics.median(samples))
            res.pooled.setdefault(name, []).extend(samples)
            res.rate.setdefault(name, []).append(rate)
        log(
            f"  round {r + 1}/{plan.rounds}: "
            + ", ".join(f"{n} {res.latency[n][-1]:.2f} ms / {res.rate[n][-1]:.0f} calls/s" for n in names)
        )


async def phase_cold(plan: Plan, daemon: Daemon, http: aiohttp.ClientSession, res: Results) -> None:
    log(f"cold first call: {plan.cold_reps} x (new session -> first mcp__echo__echo) and (bare spawn + init + call)")
    for r in range(plan.cold_reps):
        for which in ("sidecar", "bare") if r % 2 == 0 else ("bare", "sidecar"):
            if which == "bare":
                start = time.perf_counter()
                async with Client(stdio_params(), mode="legacy") as client:
                    await echo_call(client, "echo")
                    res.cold_bare.append((time.perf_counter() - start) * 1000.0)
                continue
            before = daemon.children()
            opened = time.perf_counter()
            session = await daemon.new_session(http)
            endpoint = Endpoint("sidecar", "mcp__echo__echo", session["url"], dict(session["headers"]))
            async with endpoint.client() as client:
                start = time.perf_counter()
                await echo_call(client, endpoint.tool)
                res.cold_sidecar.append((time.perf_counter() - start) * 1000.0)
                res.cold_session_open.append((start - opened) * 1000.0)
                if not daemon.children() - before:
                    raise RuntimeError("the first call in a new session spawned no connector process")
            await daemon.end_session(http, session)
            if not await daemon.settle(before):
                raise RuntimeError("the connector process outlived its ended session")
        log(f"  rep {r + 1}/{plan.cold_reps}: sidecar {res.cold_sidecar[-1]:.1f} ms, bare {res.cold_bare[-1]:.1f} ms")


async def phase_churn(plan: Plan, daemon: Daemon, http: aiohttp.ClientSession, res: Results) -> None:
    log(f"session churn: {plan.sessions} sessions created, one call each, ended ({plan.session_callers} at a time)")
    if not await daemon.settle():
        res.notes.append("daemon had children before the churn baseline")
    await asyncio.sleep(1.0)
    baseline = daemon.children()
    rss_before = daemon.rss_mb()
    peak = len(baseline)
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(daemon.children()))
            await asyncio.sleep(0.02)

    queue = iter(range(plan.sessions))
    failures: list[str] = []

    async def worker() -> None:
        for _ in queue:
            session = await daemon.new_session(http)
            try:
                result = await raw_modern(
                    http,
                    session,
                    "tools/call",
                    {"name": "mcp__echo__echo", "arguments": {"text": "x"}},
                    name="mcp__echo__echo",
                )
                if result.get("isError"):
                    failures.append(json.dumps(result)[:200])
            finally:
                await daemon.end_session(http, session)

    watcher = asyncio.create_task(watch())
    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(plan.session_callers)))
    finally:
        wall = time.perf_counter() - start
        settle_start = time.perf_counter()
        settled = await daemon.settle(baseline)
        settle_s = time.perf_counter() - settle_start
        stop.set()
        await watcher
    await asyncio.sleep(1.0)
    res.churn = {
        "sessions": plan.sessions,
        "wall_s": wall,
        "settle_s": settle_s,
        "settled": settled,
        "baseline": len(baseline),
        "peak": peak,
        "final": len(daemon.children()),
        "leaked": len(daemon.children() - baseline),
        "rss_before": rss_before,
        "rss_after": daemon.rss_mb(),
        "failures": len(failures),
    }
    if failures:
        res.notes.append(f"{len(failures)} churn calls failed, e.g. {failures[0]}")
    log(f"  {plan.sessions} sessions in {wall:.1f}s; children {len(baseline)} -> peak {peak} -> {res.churn['final']}")


async def phase_list(plan: Plan, daemon: Daemon, http: aiohttp.ClientSession, res: Results) -> None:
    ids = [f"echo{i}" for i in range(CONNECTORS)]
    log(f"tools/list: trusting {CONNECTORS} connectors, then {plan.list_reps} brand-new sessions")
    await daemon.control(http, "POST", "/control/connectors/echo/untrust")
    for connector in ids:
        await trust(http, daemon, connector)
    if not await daemon.settle():
        raise RuntimeError("trust probes did not exit")
    spawned: set[int] = set()
    for _ in range(plan.list_reps):
        session = await daemon.new_session(http)
        before = daemon.children()
        done = asyncio.Event()

        async def watch(before: set[int] = before, done: asyncio.Event = done) -> None:
            while not done.is_set():
                spawned.update(daemon.children() - before)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        start = time.perf_counter()
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            result = await raw_modern(http, session, "tools/list", {"cursor": cursor} if cursor else {})
            tools += result.get("tools", [])
            cursor = result.get("nextCursor")
            if not cursor:
                break
        res.list_ms.append((time.perf_counter() - start) * 1000.0)
        done.set()
        await watcher
        spawned.update(daemon.children() - before)
        res.list_tools = sum(1 for t in tools if t["name"].startswith("mcp__echo"))
        names = {t["name"] for t in tools}
        missing = [c for c in ids if f"mcp__{c}__echo" not in names]
        if missing:
            raise RuntimeError(f"tools/list on a new session lacks the tools of {missing}")
        await daemon.end_session(http, session)
    res.list_spawned = len(spawned)
    log(f"  median {statistics.median(res.list_ms):.2f} ms for {res.list_tools} connector tools")


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))] if ordered else float("nan")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def render(res: Results, plan: Plan, name: str, proxy_version: str | None) -> str:
    rows: list[tuple[str, ...]] = [("metric", "sidecar", "reference", "ratio s/r", "target")]
    lat = {n: _med(v) for n, v in res.latency.items()}
    rate = {n: _med(v) for n, v in res.rate.items()}
    have_proxy = "mcp-proxy" in lat

    def lat_cell(n: str) -> str:
        return f"{lat[n]:.2f} (p95 {_p95(res.pooled[n]):.2f})"

    ratio = lat["sidecar"] / lat["direct"]
    rows.append(
        (
            "tools/call median ms vs direct",
            lat_cell("sidecar"),
            lat_cell("direct"),
            f"{ratio:.2f}",
            f"{_verdict(ratio <= LATENCY_VS_DIRECT)} (<= {LATENCY_VS_DIRECT})",
        )
    )
    if have_proxy:
        ratio = lat["sidecar"] / lat["mcp-proxy"]
        rows.append(
            (
                "tools/call median ms vs mcp-proxy",
                lat_cell("sidecar"),
                lat_cell("mcp-proxy"),
                f"{ratio:.2f}",
                f"{_verdict(ratio <= LATENCY_VS_PROXY)} (<= {LATENCY_VS_PROXY})",
            )
        )
        rows.append(
            (
                "  (info) mcp-proxy vs direct, median ms",
                lat_cell("mcp-proxy"),
                lat_cell("direct"),
                f"{lat['mcp-proxy'] / lat['direct']:.2f}",
                "",
            )
        )
    else:
        rows.append(("tools/call median ms vs mcp-proxy", lat_cell("sidecar"), "n/a", "-", "SKIPPED"))
    ratio = rate["sidecar"] / rate["direct"]
    rows.append(
        (
            f"tools/call x{CALLERS} callers calls/s vs direct",
            f"{rate['sidecar']:.0f}",
            f"{rate['direct']:.0f}",
            f"{ratio:.2f}",
            f"{_verdict(ratio >= THROUGHPUT_VS_DIRECT)} (>= {THROUGHPUT_VS_DIRECT})",
        )
    )
    if have_proxy:
        rows.append(
            (
                f"  (info) x{CALLERS} calls/s vs mcp-proxy",
                f"{rate['sidecar']:.0f}",
                f"{rate['mcp-proxy']:.0f}",
                f"{rate['sidecar'] / rate['mcp-proxy']:.2f}",
                "",
            )
        )
    if "sidecar-builtin" in lat:
        rows.append(
            (
                "  (info) sidecar built-in calculate (HTTP floor) ms",
                lat_cell("sidecar-builtin"),
                lat_cell("direct"),
                f"{lat['sidecar-builtin'] / lat['direct']:.2f}",
                "",
            )
        )
        rows.append(
            (
                f"  (info) sidecar built-in x{CALLERS} calls/s",
                f"{rate['sidecar-builtin']:.0f}",
                f"{rate['direct']:.0f}",
                f"{rate['sidecar-builtin'] / rate['direct']:.2f}",
                "",
            )
        )
    for extra, label in (("sidecar-2026", "sidecar at 2026-07-28"), ("sidecar-relay", "sidecar relayed route")):
        if extra in lat:
            rows.append(
                (
                    f"  (info) {label}, median ms",
                    lat_cell(extra),
                    lat_cell("direct"),
                    f"{lat[extra] / lat['direct']:.2f}",
                    "",
                )
            )
            rows.append(
                (
                    f"  (info) {label}, x{CALLERS} calls/s",
                    f"{rate[extra]:.0f}",
                    f"{rate['direct']:.0f}",
                    f"{rate[extra] / rate['direct']:.2f}",
                    "",
                )
            )
    cold, bare = _med(res.cold_sidecar), _med(res.cold_bare)
    rows.append(
        (
            "cold first call ms vs bare spawn+init+call",
            f"{cold:.1f} (max {max(res.cold_sidecar):.1f})",
            f"{bare:.1f} (max {max(res.cold_bare):.1f})",
            f"{cold / bare:.3f}",
            f"{_verdict(cold / bare <= COLD_VS_BARE)} (<= {COLD_VS_BARE})",
        )
    )
    rows.append(
        (
            "  (info) new session: create + initialize ms",
            f"{_med(res.cold_session_open):.1f}",
            "-",
            "-",
            "",
        )
    )
    listed = _med(res.list_ms)
    rows.append(
        (
            f"new-session tools/list ms, {CONNECTORS} connectors ({res.list_tools} tools)",
            f"{listed:.2f} (p95 {_p95(res.list_ms):.2f})",
            "-",
            "-",
            f"{_verdict(listed < LIST_LIMIT_MS)} (< {LIST_LIMIT_MS:.0f} ms)",
        )
    )
    rows.append(
        (
            "  processes spawned by those tools/list",
            str(res.list_spawned),
            "-",
            "-",
            f"{_verdict(res.list_spawned == 0)} (= 0)",
        )
    )
    c = res.churn
    rows.append(
        (
            f"{c['sessions']} sessions: children base/peak/final",
            f"{c['baseline']}/{c['peak']}/{c['final']} (settled in {c['settle_s']:.1f}s)",
            "-",
            "-",
            f"{_verdict(c['leaked'] == 0 and c['settled'] and c['failures'] == 0)} (0 leaked)",
        )
    )
    growth = (c["rss_after"] - c["rss_before"]) / c["rss_before"] * 100.0
    rows.append(
        (
            f"{c['sessions']} sessions: daemon RSS MB",
            f"{c['rss_before']:.1f} -> {c['rss_after']:.1f} ({growth:+.1f}%)",
            "-",
            "-",
            f"{_verdict(growth <= RSS_GROWTH_LIMIT_PCT)} (<= {RSS_GROWTH_LIMIT_PCT:.0f}%)",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "sidecar connector proxy vs direct stdio client"
        + (f" and mcp-proxy {proxy_version}" if have_proxy else "")
        + f" - {name} run: {plan.rounds} rounds x {plan.seq_calls} sequential calls, {plan.conc_calls} calls with "
        f"{CALLERS} callers; figures are medians over rounds",
    ]
    for i, row in enumerate(rows):
        lines.append(" | ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    misses = [r[0].strip() for r in rows[1:] if r[-1].startswith("MISS")]
    lines.append("")
    lines.append("ALL TARGETS MET" if not misses else f"MISSED: {', '.join(misses)}")
    lines.append("(reference = direct SDK stdio client unless the row names mcp-proxy)")
    lines += [f"note: {n}" for n in res.notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------


async def amain(args: argparse.Namespace) -> int:
    overrides = {
        key: getattr(args, key) for key in ("rounds", "seq_calls", "conc_calls", "sessions") if getattr(args, key)
    }
    plan = dataclasses.replace(QUICK if args.quick else FULL, **overrides)
    res = Results()
    started = time.monotonic()
    proxy_exe: Path | None = None
    proxy_version: str | None = None
    if not args.no_mcp_proxy:
        proxy_exe, why = ensure_mcp_proxy()
        if proxy_exe is None:
            res.notes.append(f"mcp-proxy column skipped: {why}")
            log(res.notes[-1])
        else:
            proxy_version = _mcp_proxy_version(proxy_exe)
    else:
        res.notes.append("mcp-proxy column skipped (--no-mcp-proxy)")
    mine_before = {p.pid for p in psutil.Process().children(recursive=True)}
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-conn-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        daemon = stack.enter_context(sidecar_process(workdir))
        endpoints: dict[str, Endpoint] = {}
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60)
        ) as http:
            write_user_servers(daemon, ["echo", *(f"echo{i}" for i in range(CONNECTORS))])
            await trust(http, daemon, "echo")
            session = await daemon.new_session(http)
            endpoints["sidecar"] = Endpoint("sidecar", "mcp__echo__echo", session["url"], dict(session["headers"]))
            endpoints["direct"] = Endpoint("direct", "echo")
            endpoints["sidecar-builtin"] = dataclasses.replace(
                endpoints["sidecar"],
                name="sidecar-builtin",
                tool="calculate",
                arguments={"expression": "1+1"},
                expected="2",
            )
            # Information rows: the same call at 2026-07-28, and through the connector's own (relayed) route.
            endpoints["sidecar-2026"] = dataclasses.replace(
                endpoints["sidecar"], name="sidecar-2026", mode="2026-07-28"
            )
            relayed = await daemon.control(
                http,
                "POST",
                "/control/sessions",
                {"workspace": str(daemon.workspace), "mode": "bypass", "connector": "echo"},
            )
            endpoints["sidecar-relay"] = Endpoint("sidecar-relay", "echo", relayed["url"], dict(relayed["headers"]))
            if proxy_exe is not None:
                try:
                    _, proxy_url = stack.enter_context(mcp_proxy_process(proxy_exe, workdir))
                    endpoints["mcp-proxy"] = Endpoint("mcp-proxy", "echo", proxy_url)
                    async with endpoints["mcp-proxy"].client() as probe:
                        await echo_call(probe, "echo")
                except Exception as exc:  # the column is optional
                    endpoints.pop("mcp-proxy", None)
                    res.notes.append(f"mcp-proxy column skipped: {type(exc).__name__}: {exc}"[:400])
                    log(res.notes[-1])
            log(f"sidecar pid {daemon.pid}; paths: {', '.join(endpoints)}")
            await phase_calls(plan, endpoints, res)
            await daemon.end_session(http, session)
            await daemon.end_session(http, relayed)
            await phase_cold(plan, daemon, http, res)
            await phase_churn(plan, daemon, http, res)
            await phase_list(plan, daemon, http, res)
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"sidecar died during the benchmark (exit {daemon.proc.returncode})")
    leftover = {p.pid for p in psutil.Process().children(recursive=True)} - mine_before
    if leftover:
        res.notes.append(f"processes of this script still alive at the end: {sorted(leftover)}")
    print(render(res, plan, "quick" if args.quick else "full", proxy_version), flush=True)
    log(f"done in {time.monotonic() - started:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_connectors.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds of tools/call measurements")
    parser.add_argument("--seq-calls", type=int, help="sequential calls per path per round")
    parser.add_argument("--conc-calls", type=int, help=f"calls with {CALLERS} callers per path per round")
    parser.add_argument("--sessions", type=int, help="sessions of the churn run (target: 200)")
    parser.add_argument("--no-mcp-proxy", action="store_true", help="leave out the mcp-proxy column")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
