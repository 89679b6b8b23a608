"""Benchmark: what one layer of the daemon costs, as server CPU per call, A/B in one run.

Per-call latency on this shared machine moves by ±10-20 % between runs; server CPU per call, measured
on several daemons side by side in interleaved rounds, is steady to about ±6 %. Each *variant* is the
real daemon (``python -OO -m sidecar serve``, as scripts/run runs it) with one layer patched out by a few
lines of boot code, so the difference to ``normal`` is what that layer costs. The variants remove things
the daemon must do (audit, policy): they are measuring instruments, never configurations.

    .venv/bin/python scripts/bench_ab.py                           # legacy era, normal vs no-toolservice
    .venv/bin/python scripts/bench_ab.py --era modern normal no-audit no-validate
    .venv/bin/python scripts/bench_ab.py normal reference              # against the SDK's own server
    .venv/bin/python scripts/bench_ab.py --instructions normal reference   # instructions per call (valgrind)
    .venv/bin/python scripts/bench_ab.py --instructions --route bus|relay   # a proxied connector call

``--route bus`` calls ``mcp__echo__echo`` through ``/mcp`` and ``--route relay`` calls ``echo`` through
``/mcp/connectors/echo``: the echo fixture (``tests/connectors/fixtures/echo_server.py``) trusted as a user
connector of each daemon. Under ``--instructions`` only the daemon is counted, not the connector process.

``--instructions`` counts what each server executes per call under callgrind instead: deterministic
(runs agree to about 1 %), so it settles what CPU time cannot here, but it does not see cache misses,
kernel time or event-loop turns waiting on the kernel. Needs valgrind (Debian: ``apt install valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import bench_mcp
import benchlib
from bench_mcp import (
    Target,
    create_sidecar_session,
    raw_concurrent,
    raw_http,
    reference_process,
)  # scripts/ is sys.path[0]
from benchlib import control_call, log, sidecar_daemon

ECHO_SERVER = Path(__file__).resolve().parent.parent / "tests" / "connectors" / "fixtures" / "echo_server.py"
ROUTES = ("builtin", "bus", "relay")
"""What is called: the built-in ``calculate`` on ``/mcp``, or the echo connector proxied (``bus``) or relayed."""

VARIANTS: dict[str, str | None] = {
    "normal": None,
    # The whole per-call pipeline of the tool pool: decision, argument checks, abort registration, audit record.
    "no-toolservice": """
import sidecar.bus.tools as tools
async def call(self, session, name, arguments, **kwargs):
    output = await self._registry.get(name).handler(dict(arguments or {}), None)
    return tools.CallOutcome(tool=name, status="ok", text=output.text)
tools.ToolService.call = call
""",
    "no-audit": """
import sidecar.store.audit as audit
audit.AuditLog.append = lambda self, *args, **kwargs: None
""",
    # Every 2025-era POST answered with one JSON body instead of an SSE stream (the [mcp] json_response setting).
    "json-response": """
import mcp.server.streamable_http_manager as manager
init = manager.StreamableHTTPSessionManager.__init__
def forced(self, app, **kwargs):
    init(self, app, **{**kwargs, "json_response": True})
manager.StreamableHTTPSessionManager.__init__ = forced
""",
    "no-validate": """
import sidecar.bus.tools as tools
tools._clean_arguments = lambda tool, arguments: dict(arguments or {})
""",
    # The front door's check of the peer's OS account at accept (a netlink lookup per new connection).
    "no-peer-check": """
import sidecar.net.frontdoor as frontdoor
frontdoor.FrontDoor.checking = property(lambda self: False)
""",
}
REFERENCE = "reference"
"""Not a variant: the SDK's own uvicorn server of ``bench_mcp``, measured in the same rounds."""


@contextlib.contextmanager
def variant_daemon(workdir: Path, boot: str | None) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The daemon as benchlib starts it, with ``boot`` run first (``-c`` instead of ``-m sidecar``)."""
    popen = benchlib.subprocess.Popen

    def patched(argv: list[str], **kwargs: Any) -> Any:
        if boot:
            at = argv.index("-m")
            code = boot + "\nimport runpy\nrunpy.run_module('sidecar', run_name='__main__')\n"
            argv = [*argv[:at], "-c", code, *argv[at + 2 :]]
        return popen(argv, **kwargs)

    benchlib.subprocess.Popen = patched  # type: ignore[misc]
    try:
        with sidecar_daemon(workdir, workdir / "home") as started:
            benchlib.subprocess.Popen = popen  # type: ignore[misc]
            yield started
    finally:
        benchlib.subprocess.Popen = popen  # type: ignore[misc]


async def amain(args: argparse.Namespace) -> int:
    names: list[str] = args.variants or ["normal", "no-toolservice"]
    unknown = [n for n in names if n not in VARIANTS and n != REFERENCE]
    if unknown:
        print(f"unknown variants {unknown}; known: {', '.join([*VARIANTS, REFERENCE])}", file=sys.stderr)
        return 2
    if args.instructions and not all(shutil.which(tool) for tool in ("valgrind", "callgrind_control")):
        print("--instructions needs valgrind (Debian: apt install valgrind)", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        grind = stack.enter_context(Callgrind.patched()) if args.instructions else None
        targets: dict[str, Target] = {}
        for name in names:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"sidecar-ab-{name}-")))
            if name == REFERENCE:
                ref_proc, port = stack.enter_context(reference_process(workdir))
                targets[name] = Target(name, f"http://127.0.0.1:{port}/mcp", {}, ref_proc)
                continue
            proc, runtime = stack.enter_context(variant_daemon(workdir, VARIANTS[name]))
            workspace = workdir / "workspace"
            workspace.mkdir()
            if args.route == "builtin":
                session = await create_sidecar_session(runtime, workspace)
            else:
                session = await connector_session(runtime, workdir / "home", workspace, args.route)
            targets[name] = Target(name, session["url"], dict(session["headers"]), proc)
        if grind is not None:
            grind.stop_patching()
        async with raw_http() as http:
            if grind is not None:
                return await count_instructions(http, grind, targets, args)
            cpu: dict[str, list[float]] = {name: [] for name in names}
            p50: dict[str, list[float]] = {name: [] for name in names}
            for round_ in range(args.rounds):
                order = names if round_ % 2 else names[::-1]
                for name in order:
                    _, samples, per_call = await raw_concurrent(
                        http, targets[name], args.era, args.callers, args.calls, 80
                    )
                    cpu[name].append(per_call)
                    p50[name].append(statistics.median(samples))
                log(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{n} {cpu[n][-1]:.3f}" for n in names))
    base = statistics.median(cpu[names[0]])
    print(
        f"server CPU ms per call, {args.route}, {args.era} era, {args.callers} raw callers, "
        f"median of {args.rounds} rounds"
    )
    for name in names:
        value = statistics.median(cpu[name])
        print(f"{name:16s} {value:6.3f} ms  x{value / base:5.3f}  rounds {' '.join(f'{v:.2f}' for v in cpu[name])}")
    base = statistics.median(p50[names[0]])
    print(f"call latency p50 ms, {args.callers} raw callers, median of {args.rounds} rounds' medians")
    for name in names:
        value = statistics.median(p50[name])
        print(f"{name:16s} {value:6.3f} ms  x{value / base:5.3f}  rounds {' '.join(f'{v:.2f}' for v in p50[name])}")
    return 0


async def connector_session(runtime: dict[str, Any], home: Path, workspace: Path, route: str) -> dict[str, Any]:
    """Trust the echo fixture as user connector ``echo`` and open a session that may call it on ``route``."""
    import aiohttp

    from sidecar.paths import Paths

    config = Paths.resolve({"SIDECAR_HOME": str(home)}).config
    config.mkdir(parents=True, exist_ok=True)
    servers = config / "mcp.json"
    servers.write_text(json.dumps({"mcpServers": {"echo": {"command": sys.executable, "args": [str(ECHO_SERVER)]}}}))
    servers.chmod(0o600)
    url, token = runtime["url"], runtime["control_token"]
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # the config watcher needs a moment to see the new file
            shown = await control_call(http, url, token, "GET", "/control/connectors")
            if any(c["id"] == "echo" for c in shown["connectors"]):
                break
            await asyncio.sleep(0.1)
        await control_call(http, url, token, "POST", "/control/connectors/echo/trust")
        body: dict[str, Any] = {"workspace": str(workspace), "mode": "bypass", "allow": ["*"]}
        if route == "relay":
            body["connector"] = "echo"
        session: dict[str, Any] = await control_call(http, url, token, "POST", "/control/sessions", body)
    bench_mcp.TOOL = "echo" if route == "relay" else "mcp__echo__echo"
    bench_mcp.ARGS = {"text": bench_mcp.EXPECTED_TEXT}
    return session


class Callgrind:
    """Servers started under ``valgrind --tool=callgrind`` with counting off; ``count`` turns it on for
    the measured calls only, so start-up and warm-up are not in the figure.

    Instructions are what the server's own code does, free of this machine's noise (the same run twice
    agrees to about 1 %). They do not see time spent waiting on memory or in the kernel.
    """

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self._popen = subprocess.Popen

    @classmethod
    @contextlib.contextmanager
    def patched(cls) -> Iterator[Callgrind]:
        """Servers started inside the ``with`` run under callgrind (until ``stop_patching``)."""
        outdir = Path(tempfile.mkdtemp(prefix="sidecar-callgrind-"))
        grind = cls(outdir)
        original = (benchlib.START_TIMEOUT, bench_mcp.START_TIMEOUT)
        # Under valgrind a server takes a minute or two to start.
        benchlib.START_TIMEOUT = bench_mcp.START_TIMEOUT = 600.0
        prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={outdir}/cg.%p"]
        subprocess.Popen = lambda argv, **kwargs: grind._popen([*prefix, *argv], **kwargs)  # type: ignore[assignment,misc]
        try:
            yield grind
        finally:
            grind.stop_patching()
            benchlib.START_TIMEOUT, bench_mcp.START_TIMEOUT = original
            shutil.rmtree(outdir, ignore_errors=True)

    def stop_patching(self) -> None:
        subprocess.Popen = self._popen  # type: ignore[misc]

    def _control(self, *argv: str) -> None:
        subprocess.run(["callgrind_control", *argv], check=True, capture_output=True, timeout=300)

    async def count(self, pid: int, work: Callable[[], Awaitable[object]]) -> int:
        """Instructions the process ``pid`` executed while ``work`` ran."""
        for old in self.outdir.glob(f"cg.{pid}*"):
            old.unlink()
        await asyncio.to_thread(self._control, "--zero", str(pid))
        await asyncio.to_thread(self._control, "--instr=on", str(pid))
        await work()
        await asyncio.to_thread(self._control, "--instr=off", str(pid))
        await asyncio.to_thread(self._control, "--dump", str(pid))
        total = 0
        for dump in self.outdir.glob(f"cg.{pid}*"):
            for line in dump.read_text().splitlines():
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
        return total


async def count_instructions(http: Any, grind: Callgrind, targets: dict[str, Target], args: argparse.Namespace) -> int:
    names = list(targets)
    per_call: dict[str, float] = {}
    for name in names:
        target = targets[name]
        await raw_concurrent(http, target, args.era, args.callers, 80, 0)  # warm-up, not counted

        async def calls(target: Target = target) -> None:
            await raw_concurrent(http, target, args.era, args.callers, args.calls, 0)

        per_call[name] = await grind.count(target.pid, calls) / args.calls
        log(f"{name}: {per_call[name] / 1e6:.3f} M instructions per call")
    base = per_call[names[0]]
    print(
        f"server instructions per call (callgrind), {args.route}, {args.era} era, "
        f"{args.callers} raw callers, {args.calls} calls"
    )
    for name in names:
        print(f"{name:16s} {per_call[name] / 1e6:6.3f} M  x{per_call[name] / base:5.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "variants", nargs="*", help=f"first is the baseline; known: {', '.join([*VARIANTS, REFERENCE])}"
    )
    parser.add_argument("--era", choices=("legacy", "modern"), default="legacy")
    parser.add_argument("--route", choices=ROUTES, default="builtin", help="what is called (see above)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--calls", type=int, help="calls per round and variant (default 1600; 400 with --instructions)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count the servers' instructions per call under valgrind (deterministic; slow; one round)",
    )
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 400 if args.instructions else 1600
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
