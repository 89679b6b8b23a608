"""What the benchmark scripts share: logging, stopping what they started, and a subprocess daemon."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sidecar.tuning import PYTHON_FLAGS

START_TIMEOUT = 60.0
"""Seconds a server gets to start before the benchmark gives up."""
STOP_TIMEOUT = 15.0
"""Seconds a server gets after SIGTERM before it is killed."""


def log(message: str, *, tag: str = "bench") -> None:
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def stop(proc: subprocess.Popen[bytes], name: str, *, group: bool = False) -> None:
    """Stop a process this script started (and, with ``group``, the process group it leads)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log(f"{name} (pid {proc.pid}) ignored SIGTERM for {STOP_TIMEOUT:.0f}s; killing it")
            proc.kill()
            proc.wait(5)
    if group:  # what it spawned in its own group, should it have outlived it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def sidecar_daemon(
    workdir: Path, home: Path, *, python_args: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """``python -OO [python_args] -m sidecar serve --port 0`` (as scripts/run runs it) with ``SIDECAR_HOME=home``;
    yields (process, runtime).

    The daemon's stderr goes to ``<workdir>/sidecar.stderr``; it is stopped (bounded) on exit.
    """
    from sidecar.paths import Paths

    env = dict(os.environ)
    env["SIDECAR_HOME"] = str(home)
    paths = Paths.resolve(env)
    errlog = (workdir / "sidecar.stderr").open("wb")
    proc = subprocess.Popen(
        [sys.executable, *PYTHON_FLAGS, *python_args, "-m", "sidecar", "serve", "--port", "0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errlog,
        cwd=workdir,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sidecar exited early ({proc.returncode}): {tail(workdir / 'sidecar.stderr')}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                runtime = json.loads(paths.runtime_file.read_text())
                if runtime.get("pid") == proc.pid:
                    yield proc, runtime
                    return
            time.sleep(0.02)
        raise RuntimeError("sidecar did not write runtime.json in time")
    finally:
        stop(proc, "sidecar")
        errlog.close()
