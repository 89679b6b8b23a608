"""Run-time tuning of the daemon's own process, in one place, each item with the benchmark behind it.

Applied only where the process exists to be the daemon (``sidecar serve``, ``serve(dedicated=True)``);
a process that merely hosts ``serve()`` (the tests) keeps Python's defaults.

- ``PYTHON_FLAGS`` (``-OO``): how every launcher runs the daemon's interpreter (``scripts/run``, the
  service units, the tests' and benchmarks' subprocess daemons). It drops docstrings, which the daemon
  never reads at run time: about 3 MB less idle RSS, most of it the MCP SDK's protocol types. It also
  drops ``assert`` statements, so the daemon's code never relies on one (raise instead). Measured by
  the idle-RSS row of ``scripts/bench_mcp.py``.
- ``release_startup_memory``: one full collection and glibc's ``malloc_trim(0)`` once start-up is
  done, giving back what imports and manifest parsing allocated and freed (a few MB of idle RSS; same
  row). Only in the daemon's own process: in the tests' process it was most of the fast loop's time.
- ``skip_uvicorn``: ``sse_starlette`` (the SDK's SSE responses) imports uvicorn, and with it click and
  multiprocessing, only to hook uvicorn's shutdown when it runs under uvicorn; the daemon is served by
  aiohttp, so ``sidecar serve`` keeps that import from happening: 84.8 → 82.8 MB idle RSS (measured
  1 s after start, the idle-RSS row of ``scripts/bench_peers.py``).
- ``settle_collector``: ``gc.freeze()`` keeps the ~110 000 objects alive after start-up out of every
  later collection, and a first-generation threshold of 10 000 (Python's is 700) stops the collector
  running every few calls, since each 2025-era request leaves about 60 objects in reference cycles
  (the SDK's cancelled SSE helper tasks). Measured as instructions per call with
  ``scripts/bench_ab.py --instructions``: the collector's share halves. The garbage waits a little
  longer to be freed: a few hundred kB at most.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from typing import Final

__all__ = ["GC_THRESHOLDS", "PYTHON_FLAGS", "release_startup_memory", "settle", "settle_collector", "skip_uvicorn"]

PYTHON_FLAGS: Final = ("-OO",)
"""Interpreter flags of the daemon's process. Connector processes do not inherit them."""
GC_THRESHOLDS: Final = (10_000, 10, 10)
"""The collector's generation thresholds once the daemon runs (Python's are 700, 10, 10)."""


def skip_uvicorn() -> None:
    """Make ``import uvicorn`` fail in this process, before anything imports it (a no-op after).

    Its one importer in the daemon is ``sse_starlette``, which catches the ``ImportError`` and leaves
    uvicorn's shutdown alone, as documented for running without uvicorn.
    """
    if "uvicorn" not in sys.modules:
        sys.modules["uvicorn"] = None  # type: ignore[assignment]  # Python's way to refuse an import


def release_startup_memory() -> None:
    """Give back to the OS what start-up allocated and freed. glibc only; elsewhere a no-op."""
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def settle_collector() -> None:
    """Freeze what start-up left alive and raise the first collection threshold, for the process's life."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def settle(*, dedicated: bool) -> None:
    """Once the daemon listens, in a process of its own: release start-up memory and tune the collector.

    A process that only hosts the daemon (the tests start hundreds) keeps its memory and collector as
    they are: a full collection there costs more than the whole start and frees nothing of the daemon's.
    """
    if dedicated:
        release_startup_memory()
        settle_collector()
