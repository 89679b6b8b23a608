"""What the daemon's own events write to the audit log: routes' tokens, sessions and approvals.

The composition root (``app.py``) subscribes these to the stores; each turns one event into one record
that names what changed and never carries a secret (tokens, envelopes and approved values stay out: an
approval is named by the digest of its arguments).
"""

from __future__ import annotations

from sidecar.auth.sessions import Session
from sidecar.bus.approvals import Approval
from sidecar.store.audit import AuditLog

__all__ = ["any_event", "approval_event", "route_event", "session_event"]


def any_event(audit: AuditLog, event: str, fields: dict[str, object]) -> None:
    audit.append(event, **fields)


def route_event(audit: AuditLog, name: str, event: str) -> None:
    kind = {"registered": "token.mint", "rotated": "token.mint", "unregistered": "token.revoke"}[event]
    audit.append(kind, route=name, reason=event)


def session_event(audit: AuditLog, session: Session, event: str) -> None:
    if event == "closed":
        return  # not an end: the session is kept for the next start ("daemon.stop" records the stop)
    audit.append(
        f"session.{event}",
        session=session.id,
        project=session.project_id,
        mode=session.mode.value,
        allow=list(session.allow),
        network=session.network,
        **({"label": session.label} if session.label else {}),
    )


def approval_event(audit: AuditLog, approval: Approval, event: str) -> None:
    audit.append(
        f"approval.{event}",
        approval=approval.id,
        session=approval.session_id,
        tool=approval.tool,
        kind=approval.kind,
        group=approval.group,
        args_digest=approval.digest,
    )
