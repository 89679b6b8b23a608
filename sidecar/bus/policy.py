"""The one decision: may this session see or run this tool, in this phase (SPEC §6)?

Every path asks here — ``tools/list``, ``tool_search``, ``tools/call``, ``tool_call`` and the REST
facade — and every call asks again at execution time, so a grant that shrinks applies to the next
call. Deny by default; each rule names itself in the decision, for the audit log.

Order: the tool exists → HIGH is never exposed → the session's grant covers it → network if the tool
needs it → its availability predicate → the mode permits its risk → the billable gate (asks in every
mode, ``bypass`` included) → MEDIUM asks in ``default`` mode → allow. Listing and search never ask: a
tool that would ask at call time is visible, and the question comes when it is called.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sidecar.auth.sessions import Mode, Session
from sidecar.bus.registry import Risk, ToolDef

__all__ = ["Billing", "Decision", "Phase", "Verdict", "decide", "pattern_allows"]


class Phase(enum.StrEnum):
    LIST = "list"
    SEARCH = "search"
    CALL = "call"


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Billing:
    """What the billable gate said about a tool (``bus/billing.py``), reduced to what the decision needs."""

    billable: bool
    kind: str | None = None
    group: str | None = None


FREE = Billing(billable=False)


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    rule: str
    """Which rule decided: exists, risk-high, grant, network, unavailable, mode, billable, confirm, allow."""
    kind: str | None = None
    """For ``ask``: what kind of approval (``confirm`` for MEDIUM, the manifest's kind when billable)."""
    group: str | None = None
    """For ``ask``: the group an approval may be remembered under for the session (None: never)."""

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


def _available(tool: ToolDef, session: Session) -> bool:
    try:
        return bool(tool.available(session)) if tool.available is not None else True
    except Exception:
        return False  # a predicate that fails hides the tool


def decide(session: Session, tool: ToolDef | None, phase: Phase, billing: Billing = FREE) -> Decision:
    """Exists ∧ not HIGH ∧ granted ∧ network ∧ mode, then the questions: billable, then MEDIUM confirm."""
    if tool is None:
        return _UNKNOWN
    if tool.risk is Risk.HIGH:
        # SECURITY: HIGH tools are never listed, searchable or callable, whatever the session says.
        return Decision(Verdict.DENY, "risk-high")
    if not pattern_allows(session.allow, tool):
        return Decision(Verdict.DENY, "grant")
    if tool.needs_network and not session.network:
        return Decision(Verdict.DENY, "network")
    if tool.available is not None and not _available(tool, session):
        return Decision(Verdict.DENY, "unavailable")
    if tool.risk is Risk.MEDIUM and session.mode is Mode.READ_ONLY:
        return Decision(Verdict.DENY, "mode")
    if phase is not Phase.CALL:
        return Decision(Verdict.ALLOW, "allow")
    if billing.billable:
        # SECURITY: the billable gate asks in every mode, bypass included (SPEC §6).
        return Decision(Verdict.ASK, "billable", kind=billing.kind or "billable", group=billing.group)
    if tool.risk is Risk.MEDIUM and session.mode is Mode.DEFAULT:
        return Decision(Verdict.ASK, "confirm", kind="confirm", group=f"tool:{tool.name}")
    return Decision(Verdict.ALLOW, "allow")
