"""What the benchmark scripts share: logging, starting and stopping servers (the daemon among them), timing
calls, and reading a Streamable HTTP answer."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sidecar.tuning import PYTHON_FLAGS

START_TIMEOUT = 60.0
"""Seconds a server gets to start before the benchmark gives up."""
STOP_TIMEOUT = 15.0
"""Seconds a server gets after SIGTERM before it is killed."""

_T = TypeVar("_T")


class CallFailed(RuntimeError):
    """A measured request failed or answered something else than expected: the figures would be wrong."""


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


def wait_ready(
    proc: subprocess.Popen[bytes], name: str, errfile: Path, what: str, ready: Callable[[], _T | None]
) -> _T:
    """Poll ``ready`` until it returns something (``what``: "write runtime.json", "listen on …"); raise if
    ``proc`` exits first or ``START_TIMEOUT`` (read at call time: bench_ab raises it for valgrind) passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited early ({proc.returncode}): {tail(errfile)}")
        found = ready()
        if found is not None:
            return found
        time.sleep(0.02)
    raise RuntimeError(f"{name} did not {what} within {START_TIMEOUT:.0f}s: {tail(errfile)}")


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
    errfile = workdir / "sidecar.stderr"
    errlog = errfile.open("wb")
    proc = subprocess.Popen(
        [sys.executable, *PYTHON_FLAGS, *python_args, "-m", "sidecar", "serve", "--port", "0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=errlog,
        cwd=workdir,
    )

    def runtime_of_this_daemon() -> dict[str, Any] | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            runtime: dict[str, Any] = json.loads(paths.runtime_file.read_text())
            if runtime.get("pid") == proc.pid:
                return runtime
        return None

    try:
        yield proc, wait_ready(proc, "sidecar", errfile, "write runtime.json", runtime_of_this_daemon)
    finally:
        stop(proc, "sidecar")
        errlog.close()


async def timed(call: Callable[[], Awaitable[Any]], n: int, out: list[float]) -> None:
    """Await ``call`` ``n`` times in a row, appending each latency (ms) to ``out``."""
    for _ in range(n):
        start = time.perf_counter()
        await call()
        out.append((time.perf_counter() - start) * 1000.0)


def answer(content_type: str, body: bytes, request_id: int) -> dict[str, Any]:
    """The JSON-RPC answer to ``request_id`` in a Streamable HTTP response: the JSON body, or the SSE
    ``data:`` event that carries it (others, such as notifications, are passed over)."""
    if content_type.startswith("text/event-stream"):
        for line in body.splitlines():
            if line.startswith(b"data:") and (payload := line[5:].strip()):
                message = json.loads(payload)
                if message.get("id") == request_id:
                    return message  # type: ignore[no-any-return]
        raise CallFailed(f"no answer to request {request_id} in SSE body {body[:300]!r}")
    return json.loads(body)  # type: ignore[no-any-return]


async def control_call(http: Any, base_url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One call of a benchmark daemon's control API (``http`` an ``aiohttp.ClientSession``); 300 and up raise."""
    import aiohttp

    async with http.request(
        method,
        base_url + path,
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=60),
    ) as response:
        data = await response.json(content_type=None)
        if response.status >= 300:
            raise RuntimeError(f"{method} {path} answered {response.status}: {data}")
        return data


_FENCE = re.compile(
    r'<untrusted-content connector="[a-z0-9-]+" fence="([0-9a-f]{8})">\n(.*)\n</untrusted-content fence="\1">', re.S
)


def unfenced(text: object) -> object:
    """A connector's text inside the daemon's untrusted-content fence (``sidecar/bus/untrusted.py``);
    anything else as it is. A bench checks what the connector said, whatever the marking."""
    found = _FENCE.fullmatch(text) if isinstance(text, str) else None
    return found.group(2) if found is not None else text
