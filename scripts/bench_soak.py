"""Benchmark: a soak with connectors killed at random, session churn, and ``kill -9`` of the daemon mid-write.

Issue 11 item 8. Three runs, each against ``python -OO -m sidecar serve --port 0`` (``benchlib.sidecar_daemon``)
with a throw-away ``SIDECAR_HOME``; every request goes to 127.0.0.1; every phase is bounded in count and time.

1. **Soak.** One user connector (``tests/connectors/fixtures/echo_server.py``) trusted; ``SESSIONS`` sessions
   (``bypass``, each with a workspace of its own) each hold their own connector process. ``CALLS`` calls of
   ``mcp__echo__echo`` in all, one sequential caller per session (2026-07-28 single POSTs). Meanwhile, every
   2-5 s (random), one connector process is SIGKILLed; the victim is found by the workspace its
   environment names, and no session loses a process twice within the pool's crash window (so none is
   driven into ``error``). A failed call counts as *the killed connector's own* when it belongs to the
   victim's session and was in flight at the kill or began within ``RECOVERY`` seconds after it; any other
   failed call is a failure of the daemon. Then every session ends, and no process may be left: no child
   of the daemon, and no process anywhere carrying this run's marker in its environment. The daemon's
   RSS is taken after warm-up (every session has made one call), after the soak, and after the end.
2. **Churn.** ``CHURN`` sessions, ``CHURN_CALLERS`` at a time: each is created, calls ``echo`` and a
   connector that double-forks a ``setsid`` grandchild at start (``fixtures/quick_forker.py``), and is
   ended. Then the daemon must have no descendant, no grandchild may live, and no process may carry the
   run's marker.
3. **kill -9 during trust writes.** ``KILLS`` rounds: start the daemon, trust and untrust connectors back to
   back through the control API (each one a write of ``approvals.json``; the connectors' commands do not
   exist, so trusting them writes the store and fails fast to start them), and SIGKILL the daemon at a
   random moment 50-600 ms in. The store must then read (strictly, as the daemon reads it) as the state
   after the last acknowledged change or the one in flight, never anything else; the next daemon must
   start on it. Counted: rounds whose kill left a temp file (it landed between the temp file's creation
   and the rename).

    .venv/bin/python scripts/bench_soak.py            # full run: 10 000 calls / 50 sessions, 200 sessions, 100 kills
    .venv/bin/python scripts/bench_soak.py --quick    # smoke run (~1 min)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from benchlib import CallFailed, answer, control_call, log, sidecar_daemon, unfenced  # scripts/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "connectors" / "fixtures"
ECHO_SERVER = FIXTURES / "echo_server.py"
QUICK_FORKER = FIXTURES / "quick_forker.py"
MODERN = "2026-07-28"

KILL_EVERY = (2.0, 5.0)
"""Seconds between connector kills in the soak (uniform)."""
CRASH_WINDOW = 60.0
"""The pool's crash-loop window (``connectors.pool.CRASH_WINDOW``): a session loses at most one process in it."""
RECOVERY = 10.0
"""Seconds after a kill during which the victim session's failures are its own (backoff + restart)."""
SETTLE = 30.0
"""Seconds the daemon may take to have no descendant left after the sessions end."""
KILL_AFTER = (0.05, 0.6)
"""Seconds into a round of trust writes when the daemon is SIGKILLed (uniform)."""
TOGGLED = 8
"""Connectors the trust-write rounds trust and untrust in turn."""


@dataclass(frozen=True)
class Plan:
    sessions: int
    calls: int
    churn: int
    churn_callers: int
    kills: int
    deadline: float
    """Seconds the whole run may take."""


FULL = Plan(sessions=50, calls=10_000, churn=200, churn_callers=8, kills=100, deadline=1800.0)
QUICK = Plan(sessions=10, calls=3000, churn=20, churn_callers=4, kills=10, deadline=300.0)


@dataclass
class Call:
    session: int
    start: float
    end: float
    error: str | None


@dataclass
class Kill:
    at: float
    session: int
    pid: int


@dataclass
class Figures:
    soak: dict[str, Any] = field(default_factory=dict)
    churn: dict[str, Any] = field(default_factory=dict)
    crash: dict[str, Any] = field(default_factory=dict)


# -- the daemon and its connectors ------------------------------------------------------------------------


@dataclass
class Daemon:
    proc: Any
    url: str
    token: str
    home: Path

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    async def control(self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None) -> Any:
        return await control_call(http, self.url, self.token, method, path, body)

    async def settle(self) -> bool:
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            if not self.descendants():
                return True
            await asyncio.sleep(0.05)
        return False


@contextlib.contextmanager
def daemon_in(workdir: Path, *, settings: str = "", servers: dict[str, Any] | None = None) -> Iterator[Daemon]:
    home = workdir / "home"
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True, mode=0o700)
    if settings:
        _private(config / "sidecar.toml", settings)
    if servers is not None:
        _private(config / "mcp.json", json.dumps({"mcpServers": servers}))
    with sidecar_daemon(workdir, home) as (proc, runtime):
        yield Daemon(proc, runtime["url"], runtime["control_token"], home)


def _private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def _marked(marker: str) -> list[int]:
    """Every process on the machine whose environment carries this run's marker (the user's own only)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("BENCH_RUN") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


_ids = itertools.count(1)


async def call_tool(http: aiohttp.ClientSession, session: dict[str, Any], name: str) -> str | None:
    """One 2026-07-28 ``tools/call``; None if it succeeded, else what went wrong."""
    request_id = next(_ids)
    headers = {
        **session["headers"],
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    params = {"name": name, "arguments": {"text": "soak"}, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    try:
        async with http.post(session["url"], data=json.dumps(body), headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                return f"HTTP {response.status}: {raw[:200]!r}"
            message = answer(response.headers.get("content-type", ""), raw, request_id)
    except (aiohttp.ClientError, TimeoutError, CallFailed, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    result = message.get("result")
    if not isinstance(result, dict):
        return json.dumps(message)[:200]
    content = result.get("content") or [{}]
    if result.get("isError") or unfenced(content[0].get("text")) != "soak":
        return json.dumps(content)[:200]
    return None


# -- 1. soak -----------------------------------------------------------------------------------------------


async def soak(plan: Plan, workdir: Path, figures: Figures) -> None:
    marker = os.urandom(8).hex()
    per_session = plan.calls // plan.sessions
    log(f"soak: {per_session * plan.sessions} calls over {plan.sessions} sessions, a connector killed every 2-5 s")
    settings = f"[connectors]\nmax_per_connector = {plan.sessions + 8}\nmax_total = {plan.sessions + 16}\n"
    server = {
        "command": sys.executable,
        "args": [str(ECHO_SERVER)],
        "env": {"BENCH_RUN": marker, "BENCH_WORKSPACE": "${SIDECAR_PROJECT_DIR}"},
    }
    workspaces = [workdir / "ws" / str(i) for i in range(plan.sessions)]
    for ws in workspaces:
        ws.mkdir(parents=True)
    with daemon_in(workdir, settings=settings, servers={"echo": server}) as daemon:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=plan.sessions + 8)) as http:
            shown = await daemon.control(http, "POST", "/control/connectors/echo/trust")
            if shown.get("state") != "trusted":
                raise RuntimeError(f"trusting echo failed: {shown}")
            sessions = [
                await daemon.control(
                    http,
                    "POST",
                    "/control/sessions",
                    {"workspace": str(ws), "mode": "bypass", "project": "soak", "allow": ["*"]},
                )
                for ws in workspaces
            ]
            index_of = {str(ws.resolve()): i for i, ws in enumerate(workspaces)}
            warm = await asyncio.gather(*(call_tool(http, s, "mcp__echo__echo") for s in sessions))
            if any(warm):
                raise RuntimeError(f"warm-up call failed: {next(e for e in warm if e)}")
            await asyncio.sleep(1.0)
            rss_warm = daemon.rss_mb()

            calls: list[Call] = []
            kills: list[Kill] = []
            done = asyncio.Event()

            async def caller(i: int) -> None:
                for _ in range(per_session):
                    start = time.monotonic()
                    error = await call_tool(http, sessions[i], "mcp__echo__echo")
                    calls.append(Call(i, start, time.monotonic(), error))

            async def killer() -> None:
                rng = random.Random(11)
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), rng.uniform(*KILL_EVERY))
                    if done.is_set():
                        return
                    now = time.monotonic()
                    recent = {k.session for k in kills if now - k.at < CRASH_WINDOW}
                    victims = []
                    for proc in daemon.descendants():
                        with contextlib.suppress(psutil.Error):
                            where = proc.environ().get("BENCH_WORKSPACE")
                            if where in index_of and index_of[where] not in recent and proc.ppid() == daemon.pid:
                                victims.append((index_of[where], proc.pid))
                    if not victims:
                        continue
                    session, pid = rng.choice(victims)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        kills.append(Kill(time.monotonic(), session, pid))

            samples: list[tuple[int, float]] = [(0, rss_warm)]  # (calls made, RSS MB)

            async def sampler() -> None:
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), 0.25)
                    samples.append((len(calls), daemon.rss_mb()))

            started = time.monotonic()
            kill_task = asyncio.create_task(killer())
            sample_task = asyncio.create_task(sampler())
            try:
                async with asyncio.timeout(plan.deadline / 2):
                    await asyncio.gather(*(caller(i) for i in range(plan.sessions)))
            finally:
                done.set()
                await kill_task
                await sample_task
            wall = time.monotonic() - started
            rss_soak = daemon.rss_mb()

            own, other = [], []
            for call in calls:
                if call.error is None:
                    continue
                mine = any(
                    k.session == call.session and (call.start <= k.at <= call.end or 0 <= call.start - k.at <= RECOVERY)
                    for k in kills
                )
                (own if mine else other).append(call)
            for s in sessions:
                await daemon.control(http, "DELETE", f"/control/sessions/{s['session_id']}")
            settled = await daemon.settle()
            await asyncio.sleep(1.0)
            rss_end = daemon.rss_mb()
            latencies = sorted((c.end - c.start) * 1000 for c in calls if c.error is None)
            figures.soak = {
                "sessions": plan.sessions,
                "calls": len(calls),
                "wall_s": round(wall, 1),
                "calls_per_s": round(len(calls) / wall, 1),
                "median_ms": round(statistics.median(latencies), 2) if latencies else None,
                "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1], 2) if latencies else None,
                "kills": len(kills),
                "failed_own": len(own),
                "failed_other": len(other),
                "other_examples": [c.error for c in other[:3]],
                "settled": settled,
                "left_children": len(daemon.descendants()),
                "left_marked": len(_marked(marker)),
                "rss_warm_mb": round(rss_warm, 1),
                "rss_at_half_mb": round(next(rss for n, rss in samples if n >= len(calls) // 2), 1),
                "rss_peak_mb": round(max(rss for _, rss in samples), 1),
                "rss_after_soak_mb": round(rss_soak, 1),
                "rss_after_end_mb": round(rss_end, 1),
            }
    figures.soak["left_marked_after_stop"] = len(_marked(marker))
    log(f"  {json.dumps(figures.soak)}")


# -- 2. churn ----------------------------------------------------------------------------------------------


async def churn(plan: Plan, workdir: Path, figures: Figures) -> None:
    marker = os.urandom(8).hex()
    log(f"churn: {plan.churn} sessions opened, calling two connectors (one double-forks at start), ended")
    pid_dir = workdir / "grandchildren"
    pid_dir.mkdir()
    env = {"BENCH_RUN": marker}
    servers = {
        "echo": {"command": sys.executable, "args": [str(ECHO_SERVER)], "env": env},
        "forker": {"command": sys.executable, "args": [str(QUICK_FORKER), str(pid_dir)], "env": env},
    }
    workspace = workdir / "ws"
    workspace.mkdir()
    with daemon_in(workdir, servers=servers) as daemon:
        async with aiohttp.ClientSession() as http:
            for connector in servers:
                shown = await daemon.control(http, "POST", f"/control/connectors/{connector}/trust")
                if shown.get("state") != "trusted":
                    raise RuntimeError(f"trusting {connector} failed: {shown}")
            await daemon.settle()
            rss_before = daemon.rss_mb()
            peak = 0
            failures: list[str] = []
            queue = iter(range(plan.churn))
            stop = asyncio.Event()

            async def watch() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, len(daemon.descendants()))
                    await asyncio.sleep(0.05)

            async def worker() -> None:
                for _ in queue:
                    body = {"workspace": str(workspace), "mode": "bypass", "project": "churn", "allow": ["*"]}
                    session = await daemon.control(http, "POST", "/control/sessions", body)
                    try:
                        for tool in ("mcp__echo__echo", "mcp__forker__echo"):
                            if (error := await call_tool(http, session, tool)) is not None:
                                failures.append(error)
                    finally:
                        await daemon.control(http, "DELETE", f"/control/sessions/{session['session_id']}")

            watcher = asyncio.create_task(watch())
            started = time.monotonic()
            try:
                async with asyncio.timeout(plan.deadline / 4):
                    await asyncio.gather(*(worker() for _ in range(plan.churn_callers)))
            finally:
                wall = time.monotonic() - started
                settled = await daemon.settle()
                stop.set()
                await watcher
            grandchildren = [int(p.name) for p in pid_dir.iterdir()]
            alive = [pid for pid in grandchildren if psutil.pid_exists(pid) and _not_zombie(pid)]
            await asyncio.sleep(1.0)
            figures.churn = {
                "sessions": plan.churn,
                "wall_s": round(wall, 1),
                "failures": len(failures),
                "failure_examples": failures[:3],
                "peak_descendants": peak,
                "settled": settled,
                "left_descendants": len(daemon.descendants()),
                "grandchildren": len(grandchildren),
                "grandchildren_alive": len(alive),
                "left_marked": len(_marked(marker)),
                "rss_before_mb": round(rss_before, 1),
                "rss_after_mb": round(daemon.rss_mb(), 1),
            }
    log(f"  {json.dumps(figures.churn)}")


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- 3. kill -9 during trust writes ------------------------------------------------------------------------


def _expected_states(ops: int) -> list[frozenset[str]]:
    """The trusted names after each of the first ``ops`` operations of the round-robin (index 0: none yet)."""
    states = [frozenset()]
    current: set[str] = set()
    for op in range(ops):
        name = f"t{op % TOGGLED}"
        current ^= {name}
        states.append(frozenset(current))
    return states


async def _writes_until_killed(
    daemon: Daemon, http: aiohttp.ClientSession, first_op: int, states: list[frozenset[str]], after: float
) -> tuple[int, bool]:
    """Trust and untrust in turn, back to back, from operation ``first_op``; SIGKILL the daemon ``after``
    seconds in. Returns how many changes it acknowledged, and whether one was in flight at the kill."""
    acked = 0
    in_flight = False

    async def writes() -> None:
        nonlocal acked, in_flight
        while True:
            op = first_op + acked
            name = f"t{op % TOGGLED}"
            action = "untrust" if name in states[op] else "trust"
            in_flight = True
            await daemon.control(http, "POST", f"/control/connectors/{name}/{action}")
            in_flight = False
            acked += 1

    task = asyncio.create_task(writes())
    await asyncio.sleep(after)
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.proc.wait(10)
    was_in_flight = in_flight
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, RuntimeError):
        await task
    return acked, was_in_flight


async def crash_writes(plan: Plan, workdir: Path, figures: Figures) -> None:
    from sidecar.store.trust import TrustStore

    log(f"kill -9 during trust writes: {plan.kills} rounds")
    servers = {f"t{i}": {"command": f"/nonexistent/sidecar-bench-{i}"} for i in range(TOGGLED)}
    rng = random.Random(8)
    store_path = workdir / "home" / "state" / "approvals.json"
    done_ops = 0  # operations acknowledged over all rounds: the store's state is _expected_states()[done_ops]
    torn = 0
    left_temp = 0
    mid_request = 0
    ops_per_round: list[int] = []
    states = _expected_states(plan.kills * 400)
    for round_no in range(plan.kills):
        with daemon_in(workdir, servers=servers) as daemon:
            async with aiohttp.ClientSession() as http:
                status = await daemon.control(http, "GET", "/control/status")
                if status["trust_store_problem"] is not None:
                    raise RuntimeError(f"round {round_no}: the daemon refused the store: {status}")
                acked_this_round, in_flight = await _writes_until_killed(
                    daemon, http, done_ops, states, rng.uniform(*KILL_AFTER)
                )
                mid_request += in_flight
        acked = done_ops + acked_this_round
        temps = list(store_path.parent.glob(f".{store_path.name}.*.tmp"))
        left_temp += bool(temps)
        store = TrustStore(store_path)  # as the next daemon reads it: strictly, never a temp file
        found = frozenset(store.names())
        if store.problem is not None or found not in (states[acked], states[acked + 1]):
            torn += 1
            log(f"  round {round_no}: store is neither old nor new: problem={store.problem} names={sorted(found)}")
            done_ops = acked  # carry on from what we can tell
        else:
            done_ops = acked + (found == states[acked + 1])
        ops_per_round.append(acked_this_round)
    figures.crash = {
        "rounds": plan.kills,
        "torn_or_other": torn,
        "killed_with_a_request_in_flight": mid_request,
        "left_a_temp_file": left_temp,
        "writes_acknowledged": sum(ops_per_round),
        "median_writes_per_round": statistics.median(ops_per_round),
    }
    log(f"  {json.dumps(figures.crash)}")


# -- report ------------------------------------------------------------------------------------------------


def render(figures: Figures, plan: Plan) -> str:
    s, c, k = figures.soak, figures.churn, figures.crash
    soak_rss = (
        f"{s['rss_warm_mb']} → {s['rss_at_half_mb']} → {s['rss_after_soak_mb']} MB "
        f"({_pct(s['rss_warm_mb'], s['rss_after_soak_mb'])}; "
        f"second half {_pct(s['rss_at_half_mb'], s['rss_after_soak_mb'])})"
    )
    lines = [
        "| run | figure | value |",
        "|---|---|---|",
        f"| soak | calls over sessions, wall time | {s['calls']} over {s['sessions']}, {s['wall_s']} s "
        f"({s['calls_per_s']} calls/s, median {s['median_ms']} ms, p99 {s['p99_ms']} ms) |",
        f"| soak | connector processes SIGKILLed | {s['kills']} |",
        f"| soak | failed calls: the killed connectors' own / any other | {s['failed_own']} / {s['failed_other']} |",
        f"| soak | daemon RSS after warm-up → half the calls → all | {soak_rss} |",
        f"| soak | processes left after the sessions ended (children / marked anywhere) | "
        f"{s['left_children']} / {s['left_marked']} |",
        f"| churn | sessions opened, used (2 connectors, one double-forking) and ended | {c['sessions']} in "
        f"{c['wall_s']} s, {c['failures']} failed calls |",
        f"| churn | daemon descendants: peak → left | {c['peak_descendants']} → {c['left_descendants']} |",
        f"| churn | setsid grandchildren forked / alive after | {c['grandchildren']} / {c['grandchildren_alive']} |",
        f"| churn | daemon RSS before → after | {c['rss_before_mb']} → {c['rss_after_mb']} MB "
        f"({_pct(c['rss_before_mb'], c['rss_after_mb'])}) |",
        f"| kill -9 | rounds; store torn or neither old nor new | {k['rounds']}; {k['torn_or_other']} |",
        f"| kill -9 | killed with a trust write in flight / between temp file and rename | "
        f"{k['killed_with_a_request_in_flight']} / {k['left_a_temp_file']} |",
    ]
    return "\n".join(lines)


def _pct(before: float, after: float) -> str:
    return f"{(after - before) / before * 100:+.1f} %"


async def amain(args: argparse.Namespace, figures: Figures) -> int:
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sidecar-soak-") as tmp:
        root = Path(tmp)
        async with asyncio.timeout(plan.deadline):
            for phase, run in (("soak", soak), ("churn", churn), ("crash", crash_writes)):
                if args.only and phase not in args.only:
                    continue
                workdir = root / phase
                workdir.mkdir()
                await run(plan, workdir, figures)
    log(f"done in {time.monotonic() - started:.0f}s")
    if args.only:
        print(json.dumps(figures.__dict__, indent=2))
        return 0
    print(render(figures, plan))
    ok = (
        figures.soak["failed_other"] == 0
        and figures.soak["left_children"] == 0
        and figures.soak["left_marked_after_stop"] == 0
        and figures.churn["left_descendants"] == 0
        and figures.churn["grandchildren_alive"] == 0
        and figures.churn["left_marked"] == 0
        and figures.crash["torn_or_other"] == 0
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench_soak.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--only", action="append", choices=["soak", "churn", "crash"], help="run only this phase")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    figures = Figures()
    code = asyncio.run(amain(args, figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures.__dict__, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
