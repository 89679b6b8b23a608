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
- ``raise_open_files_limit``: the soft ``RLIMIT_NOFILE`` is raised to the hard one before the daemon
  listens. Every connection, connector pipe and relayed stream is a descriptor, and a soft limit of 1024
  (a common default) is reached by a few hundred clients with their connectors; past it ``accept`` fails
  with ``EMFILE``. ``scripts/bench_peer.py`` does the same to hold 10 000 sockets open. The hard limit
  is the administrator's (``LimitNOFILE=`` in a systemd unit), never exceeded. Connector processes
  inherit the raised soft limit, as they would under a service manager that sets it.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import resource
import sys
from typing import Final

__all__ = [
    "GC_THRESHOLDS",
    "PYTHON_FLAGS",
    "raise_open_files_limit",
    "release_startup_memory",
    "settle",
    "settle_collector",
    "skip_uvicorn",
]

logger = logging.getLogger(__name__)

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


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the soft limit now in force.

    Process-wide: only for a process that exists to be the daemon (``serve(dedicated=True)``), never one
    that merely hosts it (the tests). Where the hard limit cannot be taken whole (macOS refuses an
    unlimited one), the soft limit stays as it was, and the log says so.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.warning("cannot raise the open-files limit from %d to %d (%s); keeping %d", soft, hard, exc, soft)
        return soft
    logger.info("open-files limit raised from %d to %d", soft, hard)
    return hard
