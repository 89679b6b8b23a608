"""CI: an installed wheel is a whole sidecar (issue 10, item 10).

Builds the wheel from this checkout, installs it (and its dependencies) into a fresh virtual environment
in a temporary directory, and starts ``python -m sidecar serve --port 0`` from there with a temporary
``SIDECAR_HOME``, from a directory outside the checkout so nothing of the checkout can be imported. Then:
``/healthz`` answers, the shipped ``workspace`` connector is listed and can be trusted (it starts from
the installed package), and the shipped billing manifest is loaded (no billing problem in
``/control/status``). The daemon is stopped through the control API, killed if it does not stop in
time; every step is bounded and no process is left behind.

Run by ``scripts/test`` (not ``--fast``): ``python scripts/check_wheel.py``. Exit 0 when whole, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT: Final = 300.0
"""Seconds to build the wheel (pip fetches setuptools into an isolated build environment)."""
INSTALL_TIMEOUT: Final = 600.0
"""Seconds to install it with its dependencies into a fresh environment (from pip's cache when warm)."""
START_TIMEOUT: Final = 30.0
"""Seconds for the daemon to write runtime.json."""
STOP_TIMEOUT: Final = 20.0
"""Seconds for a graceful stop before the daemon is killed."""
HTTP_TIMEOUT: Final = 30.0
"""Seconds one control request may take (trusting starts the connector once)."""
_NOT_SOURCES: Final = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".bench"
)


class CheckFailed(Exception):
    pass


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sidecar-wheel-") as tmp:
        work = Path(tmp)
        try:
            wheel = _build(work)
            python = _install(wheel, work / "venv")
            _check_daemon(python, work)
        except CheckFailed as exc:
            print(f"wheel check: FAILED: {exc}", file=sys.stderr)
            return 1
    print(f"wheel check: ok: {wheel.name} installs whole and serves ({time.monotonic() - started:.0f} s)")
    return 0


def _run(argv: list[str], *, timeout: float, what: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=_env())
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{what} took longer than {timeout:g} s") from None
    if done.returncode != 0:
        raise CheckFailed(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done.stdout


def _env(**extra: str) -> dict[str, str]:
    """This environment without anything that would let the checkout's code be imported."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def _build(work: Path) -> Path:
    """Build from a copy of the checkout: an in-tree build would leave ``build/`` and ``*.egg-info`` in it,
    and a stale ``SOURCES.txt`` there would add files the package data does not name."""
    source, dist = work / "src", work / "dist"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_NOT_SOURCES)
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(source)]
    _run(argv, timeout=BUILD_TIMEOUT, what="building the wheel")
    wheels = sorted(dist.glob("sidecar-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"expected one sidecar wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0]


def _install(wheel: Path, venv: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120, what="creating the virtual environment")
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], timeout=INSTALL_TIMEOUT, what="pip install")
    where = _run(
        [str(python), "-c", "import sidecar; print(sidecar.__file__)"], timeout=60, what="import", cwd=venv.parent
    )
    if not Path(where.strip()).is_relative_to(venv):
        raise CheckFailed(f"sidecar was imported from {where.strip()}, not from the fresh environment")
    return python


def _check_daemon(python: Path, work: Path) -> None:
    home = work / "home"
    runtime_file = home / "state" / "runtime.json"
    log = work / "daemon.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(python), "-m", "sidecar", "serve", "--port", "0"],
            cwd=work,  # not the checkout: `-m` puts the working directory first on sys.path
            env=_env(SIDECAR_HOME=str(home)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        runtime = _wait_for_runtime(proc, runtime_file, log)
        _checks(runtime)
        _stop(proc, runtime)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _wait_for_runtime(proc: subprocess.Popen[bytes], runtime_file: Path, log: Path) -> dict[str, Any]:
    end = time.monotonic() + START_TIMEOUT
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise CheckFailed(f"the daemon exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            runtime: dict[str, Any] = json.loads(runtime_file.read_text())
        except (FileNotFoundError, ValueError):
            runtime = {}
        if runtime.get("pid") == proc.pid:
            return runtime
        time.sleep(0.05)
    raise CheckFailed(f"no runtime.json within {START_TIMEOUT:g} s:\n{log.read_text(errors='replace')[-3000:]}")


def _request(url: str, *, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _checks(runtime: dict[str, Any]) -> None:
    url, token = runtime["url"], runtime["control_token"]
    health = _request(f"{url}/healthz")
    if health != (200, {"status": "ok"}):
        raise CheckFailed(f"/healthz answered {health}")
    status_code, status = _request(f"{url}/control/status", token=token)
    if status_code != 200:
        raise CheckFailed(f"/control/status answered {status_code}: {status}")
    if status["billing_problems"]:
        raise CheckFailed(f"the shipped billing manifest was not loaded: {status['billing_problems']}")
    ids = [c["id"] for c in status["connectors"]]
    if "workspace" not in ids:
        raise CheckFailed(
            f"the shipped workspace connector is not listed (connectors: {ids}; problems: "
            f"{status['connector_problems']})"
        )
    for name in ("console.js", "console.css", "favicon.svg"):  # the web console's files are package data
        try:
            with urllib.request.urlopen(f"{url}/ui/static/{name}", timeout=HTTP_TIMEOUT) as response:
                if not response.read():
                    raise CheckFailed(f"the console's {name} is empty")
        except urllib.error.HTTPError as err:
            raise CheckFailed(f"the console's {name} answered {err.code}: not in the wheel?") from None
    code, trusted = _request(f"{url}/control/connectors/workspace/trust", method="POST", token=token)
    if code != 200 or trusted.get("state") != "trusted":
        raise CheckFailed(f"trusting the shipped workspace connector answered {code}: {trusted}")


def _stop(proc: subprocess.Popen[bytes], runtime: dict[str, Any]) -> None:
    code, _ = _request(f"{runtime['url']}/control/stop", method="POST", token=runtime["control_token"])
    if code != 202:
        raise CheckFailed(f"/control/stop answered {code}")
    try:
        returncode = proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"the daemon did not stop within {STOP_TIMEOUT:g} s") from None
    if returncode != 0:
        raise CheckFailed(f"the daemon exited {returncode} on stop")


if __name__ == "__main__":
    sys.exit(main())
