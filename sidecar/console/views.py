"""What the web console shows: plain JSON built from the same objects and functions as the control API.

Every view reads the live state at request time (the connector service, approvals, sessions, the audit
log) and never a copy of its own; the figures the CLI prints (``status_header``, ``connector_body``) are
the very same functions. Text that came from elsewhere (a connector's error, an agent's arguments) is
sent as JSON strings and set with ``textContent`` by the page: nothing here is markup.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from sidecar.appkeys import APPROVALS, AUDIT_CHAIN, CONNECTORS, HUB, PATHS, REGISTRY, SESSIONS, TRUST
from sidecar.connectors.manager import Connector
from sidecar.connectors.manifest.trustkey import package_digest
from sidecar.control import connector_body, connector_tools, status_header
from sidecar.errors import ConfigError

__all__ = ["AUDIT_LIMIT", "audit_view", "connector_view", "overview"]

AUDIT_LIMIT: Final = 200
"""Records the audit view shows at most (the latest that match its filters)."""
_AUDIT_TAIL_BYTES: Final = 2 * 1024 * 1024
"""How much of the end of the audit log the view reads: the latest records, never the whole file."""
_FIELD_CHARS: Final = 200
"""Characters of one audit field the view sends; the log holds shapes and names, never long values."""


def overview(app: web.Application) -> dict[str, Any]:
    """Everything the console's live views show, in one answer (polled every second or two)."""
    header = status_header(app)
    sessions = {s.id: s for s in app[SESSIONS].list()}
    registry = app[REGISTRY]
    hub = app[HUB]
    approvals = []
    for approval in app[APPROVALS].list():
        session = sessions.get(approval.session_id)
        tool = registry.get(approval.tool)
        approvals.append(
            {
                **approval.public(),
                "risk": tool.risk.value if tool is not None else None,
                "project_id": session.project_id if session is not None else None,
                "workspace": session.workspace if session is not None else None,
            }
        )
    return {
        "status": {key: value for key, value in header.items() if key != "started_at"},
        "connectors": [
            {**body, "tools": connector_tools(app, body["id"])}
            for body in (connector_body(app, c) for c in app[CONNECTORS].manager.list())
        ],
        "connector_problems": [str(p) for p in app[CONNECTORS].manager.problems],
        "approvals": approvals,
        "sessions": [{**app[SESSIONS].describe(s), "clients": hub.clients(s.id)} for s in sessions.values()],
    }


async def connector_view(app: web.Application, connector_id: str) -> dict[str, Any]:
    """One connector in detail, as **Trust** shows it: exactly what would run, and how it differs from
    what was trusted before (the trust store keeps the keys trusted under its name)."""
    service = app[CONNECTORS]
    service.manager.refresh()  # the config as it is on disk now: what trusting it would trust
    connector = service.manager.get(connector_id)
    body = connector_body(app, connector, detail=True)
    body["tools"] = connector_tools(app, connector_id)
    body["package_digest"] = await _package_digest(connector)
    earlier = app[TRUST].records_named(connector_id)
    body["trusted_keys"] = [{"key": r.key, "trusted_at": r.trusted_at} for r in earlier]
    changes = await asyncio.to_thread(service.changes_since_trust, connector) if earlier else None
    body["changes"] = changes if changes and connector.key not in {r.key for r in earlier} else None
    return body


async def _package_digest(connector: Connector) -> str | None:
    spec = connector.spec
    if spec.kind not in ("package", "plugin") or spec.root is None:
        return None
    try:
        return await asyncio.to_thread(package_digest, spec.root)
    except ConfigError as exc:
        return f"unreadable: {exc}"


async def audit_view(app: web.Application, *, session: str | None, tool: str | None) -> dict[str, Any]:
    """The latest audit records (at most ``AUDIT_LIMIT``), filtered by session and tool, and the chain's
    verdict (``sidecar audit --verify``)."""
    path = app[PATHS].audit_file
    chain = app[AUDIT_CHAIN]
    records, report = await asyncio.to_thread(lambda: (_tail(path, session=session, tool=tool), chain.report()))
    return {
        "records": records,
        "verify": {"ok": report.ok, "records": report.records, "problems": report.problems[:20]},
    }


def _tail(path: Path, *, session: str | None, tool: str | None) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - _AUDIT_TAIL_BYTES))
            data = handle.read()
    except FileNotFoundError:
        return []
    if len(data) == _AUDIT_TAIL_BYTES:
        data = data.partition(b"\n")[2]  # the first line may be cut
    found: deque[dict[str, Any]] = deque(maxlen=AUDIT_LIMIT)
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if session and record.get("session") != session:
            continue
        if tool and record.get("tool") != tool:
            continue
        found.append({k: _bounded(v) for k, v in record.items() if k not in ("hash", "prev")})
    return list(reversed(found))


def _bounded(value: object) -> object:
    if isinstance(value, bool | int | float) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _FIELD_CHARS else text[: _FIELD_CHARS - 3] + "..."
