"""The benchmarks still measure what they say: one short round of each connector route.

A bench is not a test of speed (timing assertions are flaky here); this only keeps the scripts working as
the daemon changes (a connector's fenced text once broke every bench that checks a connector's answer).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

pytestmark = pytest.mark.slow  # each starts a daemon and a connector

ROOT: Final = Path(__file__).resolve().parent.parent
BOUND: Final = 180.0


@pytest.mark.parametrize("route", ["bus", "relay"])
def test_bench_ab_runs_a_round_of_a_connector_route(route: str) -> None:
    argv = [sys.executable, "scripts/bench_ab.py", "--route", route, "--rounds", "1", "--calls", "16", "--callers", "1"]
    done = subprocess.run([*argv, "normal"], cwd=ROOT, capture_output=True, text=True, timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"server CPU ms per call, {route}" in done.stdout
    assert any(line.startswith("normal ") and "x1.000" in line for line in done.stdout.splitlines()), done.stdout


def test_bench_sandbox_runs_a_round_of_both_kinds_of_spawn() -> None:
    argv = [sys.executable, "scripts/bench_sandbox.py", "--rounds", "1", "--warm", "2"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cold spawn + first call p50: boxed" in done.stdout and "warm call p50" in done.stdout, done.stdout
