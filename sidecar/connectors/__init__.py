"""Connectors: MCP servers the daemon runs behind its one endpoint (contract §5).

Its parts: ``manifest/`` (what a connector is declared as, and its trust key), ``stdio/`` (a stdio
connector's process and its lane), ``sharing/`` (warm spares and shared processes), ``pool`` (every
session's processes, supervised), ``relayed`` (the faithful relay's raw connections), ``proxy`` and
``catalog`` (a connector's tools, resources and prompts in the bus), ``manager`` and ``service`` (trust
state and the whole in step). The names below are the manifest's, re-exported.
"""

from __future__ import annotations

from sidecar.connectors.manifest.sources import (
    ConnectorSpec,
    LaunchConfig,
    ManifestProblem,
    discover,
    load_package,
    load_plugin,
    load_user_servers,
)
from sidecar.connectors.manifest.trustkey import canonical_launch, package_digest, trust_key

__all__ = [
    "ConnectorSpec",
    "LaunchConfig",
    "ManifestProblem",
    "canonical_launch",
    "discover",
    "load_package",
    "load_plugin",
    "load_user_servers",
    "package_digest",
    "trust_key",
]
