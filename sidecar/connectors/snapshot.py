"""What a connector was trusted as, kept to say what changed since (issue 14: the console's Trust view).

The trust store keeps only ``<id>::<sha256>``: enough to know that a config changed, not what. At each
trust the launch config as hashed (``trustkey.canonical_launch``: command, args, env keys and value digests, cwd, url,
header names, OAuth client, offline declaration) and the package digest are written beside the tool
cache, ``<state>/connectors/<id>.trusted.json``. A connector now ``changed`` is compared with it field by
field. The file only explains; it never grants: trust is still the key in the trust store, and a
snapshot whose key is not trusted any more, or that cannot be read, explains nothing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sidecar.connectors.manifest.sources import ConnectorSpec
from sidecar.connectors.manifest.trustkey import canonical_launch, package_digest
from sidecar.errors import ConfigError, StorageError
from sidecar.store.files import read_json, write_json
from sidecar.text import preview

__all__ = ["changes_since_trust", "record_trusted"]

logger = logging.getLogger(__name__)

_SHOWN = 160
"""Characters of one side of a change shown."""


def _path(cache_dir: Path, connector_id: str) -> Path:
    return cache_dir / f"{connector_id}.trusted.json"


def _now(spec: ConnectorSpec) -> dict[str, Any]:
    package = None
    if spec.kind in ("package", "plugin") and spec.root is not None:
        package = package_digest(spec.root)
    return {"launch": json.loads(canonical_launch(spec)), "package": package}


def record_trusted(cache_dir: Path, spec: ConnectorSpec, key: str) -> None:
    """Keep what ``spec`` is as it is trusted under ``key`` (best effort: a failure only loses the diff)."""
    try:
        write_json(_path(cache_dir, spec.id), {"key": key, **_now(spec)})
    except (StorageError, ConfigError, OSError) as exc:
        logger.warning("could not keep what %s was trusted as: %s", spec.id, exc)


def changes_since_trust(cache_dir: Path, spec: ConnectorSpec, trusted_keys: set[str]) -> list[str] | None:
    """What differs between ``spec`` now and what it was last trusted as, one line per change; None when
    that is not known (trusted before snapshots were kept, or the snapshot's key is no longer trusted)."""
    try:
        kept = read_json(_path(cache_dir, spec.id))
        now = _now(spec)
    except (FileNotFoundError, StorageError, ConfigError, OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") not in trusted_keys or not isinstance(kept.get("launch"), dict):
        return None
    changes = []
    before, after = kept["launch"], now["launch"]
    for field in sorted(set(before) | set(after)):
        if before.get(field) != after.get(field):
            changes.append(f"{field}: {_shown(before.get(field))} -> {_shown(after.get(field))}")
    if kept.get("package") != now["package"]:
        changes.append(f"package files: digest {_shown(kept.get('package'))} -> {_shown(now['package'])}")
    return changes


def _shown(value: object) -> str:
    return preview(json.dumps(value), _SHOWN, quote=False)
