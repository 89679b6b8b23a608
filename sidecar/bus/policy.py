"""The one decision: may this session see or run this tool, in this phase (SPEC §6)?

Every path asks here — ``tools/list``, ``tools/call``, the REST facade (and, later, ``tool_search`` and
``tool_call``) — and every call asks again at execution time, so a grant that shrinks applies to the
next call. Deny by default: each rule that can deny names itself in the decision for the audit log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sidecar.auth.sessions import Mode, Session
from sidecar.bus.registry import Risk, ToolDef

__all__ = ["Decision", "Phase", "Verdict", "decide", "pattern_allows"]


class Phase(enum.StrEnum):
    LIST = "list"
    SEARCH = "search"
    CALL = "call"


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    rule: str
    """Which rule decided (``exists``, ``risk-high``, ``grant``, ``network``, ``mode``, ``allow``)."""

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW


_UNKNOWN = Decision(Verdict.DENY, "exists")


def pattern_allows(patterns: tuple[str, ...], tool: ToolDef) -> bool:
    """``*``, an exact name, or ``mcp__<server>__*`` for a connector's tools."""
    for pattern in patterns:
        if pattern in {"*", tool.name}:
            return True
        if tool.source != "builtin" and pattern == f"mcp__{tool.server}__*":
            return True
    return False


def decide(session: Session, tool: ToolDef | None, phase: Phase) -> Decision:
    """Tool exists ∧ not HIGH ∧ in the grant ∧ network allowed if needed ∧ risk permitted by mode."""
    if tool is None:
        return _UNKNOWN
    if tool.risk is Risk.HIGH:
        # SECURITY: HIGH tools are never listed, searchable or callable, whatever the session says.
        return Decision(Verdict.DENY, "risk-high")
    if not pattern_allows(session.allow, tool):
        return Decision(Verdict.DENY, "grant")
    if tool.needs_network and not session.network:
        return Decision(Verdict.DENY, "network")
    if tool.risk is Risk.MEDIUM:
        if session.mode is Mode.READ_ONLY:
            return Decision(Verdict.DENY, "mode")
        if session.mode is Mode.DEFAULT and phase is Phase.CALL:
            return Decision(Verdict.ASK, "mode")
    return Decision(Verdict.ALLOW, "allow")
