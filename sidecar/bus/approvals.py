"""Human approvals for tool calls that ask (contract §6): pending, allowed once, remembered per group.

A call that the decision answers with ``ask`` either gets a live answer (MCP elicitation, handled by
the caller) or leaves a *pending approval* here, bound to the session, the tool and a digest of the
exact arguments. ``sidecar approvals allow ID`` (or the control API) grants it; the client's retry
with the same arguments then consumes it — once. ``allow ID --remember session`` instead remembers the
approval's group for the rest of the session (billable groups: images ≠ video).

``consume`` is synchronous: there is no await between checking an approval and spending it, so
parallel retries of one approval run the tool at most once.
"""

from __future__ import annotations

import enum
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from sidecar.auth.encoding import b64url_encode
from sidecar.canonical import canonical_json
from sidecar.errors import Conflict, NotFound
from sidecar.text import preview

__all__ = ["Approval", "ApprovalState", "ApprovalStore", "ShownArgument", "arguments_digest", "arguments_shown"]

PENDING_TTL: Final = 600
"""Seconds a pending or granted-but-unused approval lives (the MCP spec's bound on single-use state)."""
MAX_PENDING_PER_SESSION: Final = 64
"""Pending approvals one session may hold; the oldest is dropped beyond it."""
MAX_VALUE_SHOWN: Final = 200
"""Characters of one argument's value in a list of approvals; the rest is counted, and shown on request."""
MAX_NAME_SHOWN: Final = 80
"""Characters of an approval's arguments kept for the person deciding (the console, the control API)."""


class ApprovalState(enum.StrEnum):
    PENDING = "pending"
    ALLOWED = "allowed"
    DENIED = "denied"
    USED = "used"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class ShownArgument:
    """One top-level argument of a call waiting for approval: its name and its value as JSON text."""

    name: str
    value: str
    """The value as JSON, ASCII-escaped (so no control character or lookalike reaches a terminal raw)."""

    def public(self, *, whole: bool) -> dict[str, object]:
        """Bounded on its own (``more``: how many characters are not shown), or ``whole``."""
        if whole:
            return {"name": self.name, "value": self.value, "more": 0}
        name = self.name if len(self.name) <= MAX_NAME_SHOWN else self.name[: MAX_NAME_SHOWN - 1] + "…"
        value = self.value[:MAX_VALUE_SHOWN]
        return {"name": name, "value": value, "more": len(self.value) - len(value)}


def arguments_shown(arguments: Mapping[str, Any] | None) -> tuple[ShownArgument, ...]:
    """The arguments as the agent sent them, for the person who decides: each top-level argument on its
    own, short values (paths, names, ids) first, so a long value can never push another key out of view.

    Kept in memory with the pending approval only (never in the audit log, which records shapes): the
    person approving a call must see what it will do.
    """
    shown = [
        ShownArgument(str(name), json.dumps(value, ensure_ascii=True, default=str, sort_keys=True))
        for name, value in (arguments or {}).items()
    ]
    return tuple(sorted(shown, key=lambda argument: (len(argument.value), argument.name)))


def arguments_digest(arguments: Mapping[str, Any] | None) -> str:
    """SHA-256 of the canonical JSON of the arguments: the approval is for exactly these values."""
    # default=str and allow_nan: arguments are the client's; their digest must never fail (a stored digest
    # of plain JSON arguments is the same bytes either way).
    canonical = canonical_json(dict(arguments or {}), default=str, allow_nan=True)
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class Approval:
    id: str
    session_id: str
    tool: str
    digest: str
    kind: str
    group: str | None
    created_at: float
    expires_at: float
    state: ApprovalState = ApprovalState.PENDING
    arguments: tuple[ShownArgument, ...] = ()
    """``arguments_shown``: the call's top-level arguments, short values first."""

    def public(self, *, whole: bool = False) -> dict[str, object]:
        """What the control API and the console show; ``whole``: every argument in full (one approval)."""
        return {
            "approval_id": self.id,
            "session_id": self.session_id,
            "tool": self.tool,
            "arguments_digest": self.digest,
            "kind": self.kind,
            "group": self.group,
            "state": self.state.value,
            "created_at": int(self.created_at),
            "expires_at": int(self.expires_at),
            "arguments": [argument.public(whole=whole) for argument in self.arguments],
        }


ApprovalListener = Callable[[Approval, str], None]
"""Called with (approval, event): ``requested``, ``allowed``, ``remembered``, ``denied``, ``used``."""


class ApprovalStore:
    """In memory, like sessions: approvals die with the daemon and with their session."""

    def __init__(self, *, clock: Callable[[], float] = time.time, ttl: float = PENDING_TTL) -> None:
        self._approvals: dict[str, Approval] = {}
        self._remembered: dict[str, set[str]] = {}
        self._clock = clock
        self._ttl = ttl
        self._listeners: list[ApprovalListener] = []

    def subscribe(self, listener: ApprovalListener) -> None:
        self._listeners.append(listener)

    def request(
        self,
        *,
        session_id: str,
        tool: str,
        digest: str,
        kind: str,
        group: str | None,
        arguments: tuple[ShownArgument, ...] = (),
    ) -> Approval:
        """The pending approval for this exact call, reusing one already waiting. ``arguments`` is what the
        person deciding is shown (``arguments_shown``); the approval is bound to ``digest``."""
        now = self._clock()
        self._expire(now)
        for approval in self._approvals.values():
            if (approval.session_id, approval.tool, approval.digest, approval.state) == (
                session_id,
                tool,
                digest,
                ApprovalState.PENDING,
            ):
                return approval
        approval = Approval(
            id="ap_" + b64url_encode(secrets.token_bytes(12)),
            session_id=session_id,
            tool=tool,
            digest=digest,
            kind=kind,
            group=group,
            created_at=now,
            expires_at=now + self._ttl,
            arguments=arguments,
        )
        self._approvals[approval.id] = approval
        self._cap(session_id)
        self._emit(approval, "requested")
        return approval

    def allow(self, approval_id: str, *, remember: bool = False) -> Approval:
        """Grant a pending approval (once), or remember its group for the session."""
        approval = self._pending(approval_id)
        if remember:
            if approval.group is None:
                raise Conflict("this approval cannot be remembered (its billing could not be verified)")
            self._remembered.setdefault(approval.session_id, set()).add(approval.group)
        granted = replace(approval, state=ApprovalState.ALLOWED)
        self._approvals[approval_id] = granted
        self._emit(granted, "remembered" if remember else "allowed")
        return granted

    def deny(self, approval_id: str) -> Approval:
        denied = replace(self._pending(approval_id), state=ApprovalState.DENIED)
        self._approvals[approval_id] = denied
        self._emit(denied, "denied")
        return denied

    def remember(self, session_id: str, group: str) -> None:
        """Remember a group for a session (an elicitation answer with 'remember' ticked)."""
        self._remembered.setdefault(session_id, set()).add(group)

    def consume(self, *, session_id: str, tool: str, digest: str, group: str | None) -> str | None:
        """Spend a grant for this exact call: ``"remembered"``, ``"approved"``, or None (ask).

        No await in here: parallel retries cannot both spend the same approval.
        """
        if group is not None and group in self._remembered.get(session_id, ()):
            return "remembered"
        now = self._clock()
        for approval in list(self._approvals.values()):
            if (
                approval.state is ApprovalState.ALLOWED
                and approval.session_id == session_id
                and approval.tool == tool
                and approval.digest == digest
            ):
                if approval.expires_at <= now:
                    self._approvals[approval.id] = replace(approval, state=ApprovalState.EXPIRED)
                    continue
                used = replace(approval, state=ApprovalState.USED)
                self._approvals[approval.id] = used
                self._emit(used, "used")
                return "approved"
        return None

    def list(self, *, session_id: str | None = None, pending_only: bool = True) -> list[Approval]:
        self._expire(self._clock())
        return sorted(
            (
                a
                for a in self._approvals.values()
                if (session_id is None or a.session_id == session_id)
                and (not pending_only or a.state is ApprovalState.PENDING)
            ),
            key=lambda a: a.created_at,
        )

    def get(self, approval_id: str) -> Approval:
        approval = self._approvals.get(approval_id)
        if approval is None:
            raise NotFound(f"no approval {preview(approval_id, 64)}")
        return approval

    def forget_session(self, session_id: str) -> None:
        self._remembered.pop(session_id, None)
        for approval_id in [a.id for a in self._approvals.values() if a.session_id == session_id]:
            del self._approvals[approval_id]

    def _pending(self, approval_id: str) -> Approval:
        self._expire(self._clock())
        approval = self.get(approval_id)
        if approval.state is not ApprovalState.PENDING:
            raise Conflict(f"approval {approval_id} is {approval.state.value}, not pending")
        return approval

    def _expire(self, now: float) -> None:
        for approval in list(self._approvals.values()):
            if approval.expires_at <= now:
                if approval.state in (ApprovalState.PENDING, ApprovalState.ALLOWED):
                    self._approvals[approval.id] = replace(approval, state=ApprovalState.EXPIRED)
                if approval.expires_at + self._ttl <= now:
                    del self._approvals[approval.id]  # keep expired ones visible for one more ttl

    def _cap(self, session_id: str) -> None:
        pending = [
            a for a in self._approvals.values() if a.session_id == session_id and a.state is ApprovalState.PENDING
        ]
        for old in sorted(pending, key=lambda a: a.created_at)[:-MAX_PENDING_PER_SESSION]:
            del self._approvals[old.id]

    def _emit(self, approval: Approval, event: str) -> None:
        for listener in self._listeners:
            listener(approval, event)
