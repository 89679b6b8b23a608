"""Benchmark: what one layer of the daemon costs, as server CPU per call, A/B in one run.

Per-call latency on this shared machine moves by ±10-20 % between runs; server CPU per call, measured
on several daemons side by side in interleaved rounds, is steady to about ±6 %. Each *variant* is the
real daemon (``python -OO -m sidecar serve``, as scripts/run runs it) with one layer patched out by a few
lines of boot code, so the difference to ``normal`` is what that layer costs. The variants remove things
the daemon must do (audit, policy): they are measuring instruments, never configurations.

    .venv/bin/python scripts/bench_ab.py                           # legacy era, normal vs no-toolservice
    .venv/bin/python scripts/bench_ab.py --era modern normal no-audit no-validate
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import benchlib
from bench_mcp import Target, create_sidecar_session, raw_concurrent, raw_http  # scripts/ is sys.path[0]
from benchlib import log, sidecar_daemon

VARIANTS: dict[str, str | None] = {
    "normal": None,
    # The whole per-call pipeline of the tool pool: decision, argument checks, task, audit record.
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
    "no-validate": """
import sidecar.bus.tools as tools
tools._clean_arguments = lambda tool, arguments: dict(arguments or {})
""",
}


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
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        targets: dict[str, Target] = {}
        for name in names:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"sidecar-ab-{name}-")))
            proc, runtime = stack.enter_context(variant_daemon(workdir, VARIANTS[name]))
            workspace = workdir / "workspace"
            workspace.mkdir()
            session = await create_sidecar_session(runtime, workspace)
            targets[name] = Target(name, session["url"], dict(session["headers"]), proc)
        cpu: dict[str, list[float]] = {name: [] for name in names}
        async with raw_http() as http:
            for round_ in range(args.rounds):
                order = names if round_ % 2 else names[::-1]
                for name in order:
                    _, _, per_call = await raw_concurrent(http, targets[name], args.era, args.callers, args.calls, 80)
                    cpu[name].append(per_call)
                log(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{n} {cpu[n][-1]:.3f}" for n in names))
    base = statistics.median(cpu[names[0]])
    print(f"server CPU ms per call, {args.era} era, {args.callers} raw callers, median of {args.rounds} rounds")
    for name in names:
        value = statistics.median(cpu[name])
        print(f"{name:16s} {value:6.3f} ms  x{value / base:5.3f}  rounds {' '.join(f'{v:.2f}' for v in cpu[name])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("variants", nargs="*", help=f"first is the baseline; known: {', '.join(VARIANTS)}")
    parser.add_argument("--era", choices=("legacy", "modern"), default="legacy")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1600, help="calls per round and variant")
    return asyncio.run(amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
