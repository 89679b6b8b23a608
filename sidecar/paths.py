"""Where sidecar keeps its files: platformdirs, or everything under ``SIDECAR_HOME`` (tests always use it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

__all__ = ["APP_NAME", "Paths"]

APP_NAME = "sidecar"


@dataclass(frozen=True, slots=True)
class Paths:
    """The three roots and the well-known files inside them (contract §1)."""

    config: Path
    state: Path
    data: Path

    @classmethod
    def resolve(cls, env: dict[str, str] | None = None) -> Paths:
        """``SIDECAR_HOME=<dir>`` gives ``<dir>/config``, ``<dir>/state``, ``<dir>/data``; else platformdirs."""
        env = dict(os.environ) if env is None else env
        home = env.get("SIDECAR_HOME")
        if home:
            root = Path(home).expanduser().absolute()
            return cls(config=root / "config", state=root / "state", data=root / "data")
        return cls(
            config=Path(platformdirs.user_config_dir(APP_NAME)),
            state=Path(platformdirs.user_state_dir(APP_NAME)),
            data=Path(platformdirs.user_data_dir(APP_NAME)),
        )

    @property
    def settings_file(self) -> Path:
        return self.config / "sidecar.toml"

    @property
    def runtime_file(self) -> Path:
        return self.state / "runtime.json"

    @property
    def lock_file(self) -> Path:
        return self.state / "daemon.lock"

    @property
    def audit_file(self) -> Path:
        return self.state / "audit.jsonl"

    @property
    def log_file(self) -> Path:
        return self.state / "sidecar.log"
