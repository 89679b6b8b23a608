"""The one decision: may this session see or run this tool, in this phase (contract §6)?

Every path asks here — ``tools/list``, ``tool_search``, ``tools/call``, ``tool_call`` and the REST
facade — and every call asks again at execution time, so a grant that shrinks applies to the next
call. Deny by default; each rule names itself in the decision, for the audit log.

Order: the tool exists → HIGH is never exposed → the session's grant covers it → network if the tool
needs it → its availability predicate → the mode permits its risk → the billable gate (asks in every
mode, ``bypass`` included) → MEDIUM asks in ``default`` mode → allow. Listing and search never ask: a
tool that would ask at call time is visible, and the question comes when it is called.

The grant (``names.is_grant_pattern``): ``*`` covers every tool, ``builtin:*`` every built-in,
``mcp__<id>__*`` every tool of one connector, a name that one tool. A connector's tools are covered only
by ``*`` or a pattern naming that connector, so a session given the default grant (``builtin:*``)
never gains a connector's tools, whenever the connector is trusted. Connector tools need the network
unless their connector declares it works offline (``ToolDef.needs_network``); the same two rules decide
whether a session may use a connector at all (``reaches_connector``: its own route, ``list_connectors``)
or as a whole (``grants_connector``: its resources and prompts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from sidecar.auth.sessions import Mode, Session
from sidecar.bus.registry import Risk, ToolDef
from sidecar.names import BUILTIN_GRANT, connector_grant, split_connector_tool

__all__ = [
    "Billing",
    "Decision",
    "Phase",
    "Verdict",
    "decide",
    "grants_connector",
    "pattern_allows",
    "reaches_connector",
]


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

    @property
    def hidden(self) -> bool:
        """Denied by a rule that makes the tool none of the session's business (it does not exist, or its
        grant or network leaves it out): every path answers as for a missing tool, so a session cannot
        learn which connectors exist by probing names. Denied otherwise (HIGH, the mode, unavailable), it
        is a tool the session may know of but not run now."""
        return self.verdict is Verdict.DENY and self.rule in _HIDING_RULES


# The fixed outcomes are shared constants: list and search decide once per tool in the pool.
_UNKNOWN: Final = Decision(Verdict.DENY, "exists")
_HIGH: Final = Decision(Verdict.DENY, "risk-high")
_NOT_GRANTED: Final = Decision(Verdict.DENY, "grant")
_NO_NETWORK: Final = Decision(Verdict.DENY, "network")
_UNAVAILABLE: Final = Decision(Verdict.DENY, "unavailable")
_MODE: Final = Decision(Verdict.DENY, "mode")
_ALLOW: Final = Decision(Verdict.ALLOW, "allow")
_HIDING_RULES: Final = frozenset({"exists", "grant", "network"})


def pattern_allows(patterns: tuple[str, ...], tool: ToolDef) -> bool:
    """``*``, an exact name, ``builtin:*`` for the built-ins, or ``mcp__<server>__*`` for a connector's tools."""
    if "*" in patterns or tool.name in patterns:
        return True
    if tool.source == "builtin":
        return BUILTIN_GRANT in patterns
    return connector_grant(tool.server) in patterns


def grants_connector(session: Session, connector_id: str, *, needs_network: bool) -> bool:
    """Whether the session may use a connector whole: its grant covers it (``*`` or ``mcp__<id>__*``) and,
    unless the connector works offline, the session has the network. What reading its resources and
    prompts, and reaching its own route beyond single tools, require."""
    if needs_network and not session.network:
        return False
    return "*" in session.allow or connector_grant(connector_id) in session.allow


def reaches_connector(session: Session, connector_id: str, *, needs_network: bool) -> bool:
    """Whether the session may use any of a connector: its grant covers the connector or names one of its
    tools, and it has the network unless the connector works offline. A session that may not is never
    told the connector exists (``list_connectors``, the deferred-tools hint) nor served on its route."""
    if grants_connector(session, connector_id, needs_network=needs_network):
        return True
    if needs_network and not session.network:
        return False
    return any((parts := split_connector_tool(p)) is not None and parts[0] == connector_id for p in session.allow)


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
        return _HIGH
    if not pattern_allows(session.allow, tool):
        return _NOT_GRANTED
    if tool.needs_network and not session.network:
        return _NO_NETWORK
    if tool.available is not None and not _available(tool, session):
        return _UNAVAILABLE
    if tool.risk is Risk.MEDIUM and session.mode is Mode.READ_ONLY:
        return _MODE
    if phase is not Phase.CALL:
        return _ALLOW
    if billing.billable:
        # SECURITY: the billable gate asks in every mode, bypass included (contract §6).
        return Decision(Verdict.ASK, "billable", kind=billing.kind or "billable", group=billing.group)
    if tool.risk is Risk.MEDIUM and session.mode is Mode.DEFAULT:
        return Decision(Verdict.ASK, "confirm", kind="confirm", group=f"tool:{tool.name}")
    return _ALLOW
