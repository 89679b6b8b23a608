"""``<state>/runtime.json``: how clients find the running daemon (contract §1). Light on purpose: the CLI
imports it for every command, so it must not pull in the server."""

from __future__ import annotations

from typing import Any

from sidecar.errors import StorageError
from sidecar.paths import Paths
from sidecar.store.files import read_json
from sidecar.system import pid_alive

__all__ = ["read_runtime"]


def read_runtime(paths: Paths) -> dict[str, Any] | None:
    """The running daemon's runtime.json, or None if there is none or its pid is dead."""
    try:
        data = read_json(paths.runtime_file)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        raise StorageError(f"{paths.runtime_file} is not a sidecar runtime file")
    return data if pid_alive(data["pid"]) else None
