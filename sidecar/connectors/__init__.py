"""Connectors: MCP servers the daemon runs behind its one endpoint (contract §5).

``manifests`` reads the three sources (packages, the user's ``mcp.json``, plugins) into one
``ConnectorSpec`` shape (``spec``), validating each file as a pydantic model (``manifest_models``, whose
values are the checked types of ``manifest_fields``); ``trustkey`` pins trust to a spec's launch config
and package content.
"""

from __future__ import annotations

from sidecar.connectors.manifests import (
    ConnectorSpec,
    LaunchConfig,
    ManifestProblem,
    discover,
    load_package,
    load_plugin,
    load_user_servers,
)
from sidecar.connectors.trustkey import canonical_launch, package_digest, trust_key

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
