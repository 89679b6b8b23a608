"""A small synchronous client for the control API, reading the address and token from runtime.json."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Final

from sidecar.errors import SidecarError
from sidecar.paths import Paths
from sidecar.store.runtime import read_runtime

__all__ = ["ControlClient", "DaemonNotRunning"]

TIMEOUT: Final = 15.0
"""Seconds one control call may take (none of them does work that should take longer)."""


class DaemonNotRunning(SidecarError):
    code = "not_running"


class ControlClient:
    def __init__(self, paths: Paths) -> None:
        runtime = read_runtime(paths)
        if runtime is None:
            raise DaemonNotRunning(f"no sidecar daemon is running for {paths.state} (start: sidecar serve)")
        self.runtime = runtime
        self._base = str(runtime["url"])
        self._token = str(runtime["control_token"])

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - the URL is our own loopback daemon
            self._base + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = exc.reason
            error = SidecarError(f"daemon answered {exc.code}: {message}")
            raise error from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise DaemonNotRunning(f"cannot reach the daemon at {self._base}: {exc}") from None
