"""Running tools for a session: the decision, argument checks, execution, result shaping and audit.

``ToolService.call`` never raises to the caller: an unknown or forbidden tool, bad arguments, a tool
that throws, a tool aborted by revocation, or an oversized result each become a ``CallOutcome`` with
``is_error`` and a short message (SPEC §6). A denied call and a call to a tool that does not exist
get the same message, so names cannot be probed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.sessions import Session, session_key
from sidecar.bus.policy import Decision, Phase, Verdict, decide
from sidecar.bus.registry import CallContext, ToolDef, ToolRegistry
from sidecar.errors import ToolError
from sidecar.store.audit import AuditLog, shape_of

__all__ = ["CallOutcome", "ToolService"]

logger = logging.getLogger(__name__)

MAX_RESULT_CHARS: Final = 256 * 1024
"""Characters of tool text returned to a client; the rest is cut and marked."""
PREVIEW_CHARS: Final = 200
NOT_AVAILABLE: Final = "tool not found or not available in this session"


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """The normalized result of one call (the REST facade returns it as JSON)."""

    tool: str
    status: str  # "ok" | "error" | "denied" | "aborted"
    text: str
    structured: Mapping[str, Any] | None = None
    source: str = "builtin"
    server: str = "sidecar"
    decision: Decision | None = field(default=None, compare=False)

    @property
    def is_error(self) -> bool:
        return self.status != "ok"

    def preview(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return first[:PREVIEW_CHARS]

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "server": self.server,
            "tool": self.tool,
            "status": self.status,
            "preview": self.preview(),
            "result": {"text": self.text, "structured": self.structured, "isError": self.is_error},
        }


class ToolService:
    """The session-facing view of the registry."""

    def __init__(self, registry: ToolRegistry, *, audit: AuditLog, inflight: InflightTracker) -> None:
        self._registry = registry
        self._audit = audit
        self._inflight = inflight

    def visible(self, session: Session, phase: Phase = Phase.LIST) -> list[ToolDef]:
        """The tools this session may see, in registration order."""
        return [t for t in self._registry if decide(session, t, phase).verdict is not Verdict.DENY]

    def lookup(self, session: Session, name: str, phase: Phase = Phase.LIST) -> ToolDef | None:
        tool = self._registry.get(name)
        if tool is None or decide(session, tool, phase).verdict is Verdict.DENY:
            return None
        return tool

    async def call(
        self,
        session: Session,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        via: str,
        abort_keys: Iterable[Hashable] = (),
    ) -> CallOutcome:
        """Decide, validate, run and audit one call; never raises."""
        started = time.perf_counter()
        tool = self._registry.get(name)
        decision = decide(session, tool, Phase.CALL)
        if tool is None or decision.verdict is not Verdict.ALLOW:
            reason = NOT_AVAILABLE
            if tool is not None and decision.verdict is Verdict.ASK:
                reason = f"{name} needs approval, and approvals are not available yet"
            outcome = CallOutcome(tool=name, status="denied", text=reason, decision=decision)
            self._record(session, tool, name, arguments, outcome, decision, started, via)
            return outcome
        try:
            outcome = await self._run(session, tool, arguments, decision, abort_keys)
        except asyncio.CancelledError:
            # The caller went away (client disconnect, revocation): still leave a record of the call.
            aborted = CallOutcome(tool=name, status="aborted", text="call aborted", decision=decision)
            self._record(session, tool, name, arguments, aborted, decision, started, via)
            raise
        self._record(session, tool, name, arguments, outcome, decision, started, via)
        return outcome

    async def _run(
        self,
        session: Session,
        tool: ToolDef,
        arguments: Mapping[str, Any] | None,
        decision: Decision,
        abort_keys: Iterable[Hashable],
    ) -> CallOutcome:
        def fail(status: str, text: str) -> CallOutcome:
            return CallOutcome(
                tool=tool.name, status=status, text=text, decision=decision, source=tool.source, server=tool.server
            )

        args = _clean_arguments(tool, arguments)
        if isinstance(args, str):
            return fail("error", args)
        context = CallContext(session_id=session.id, project_id=session.project_id, workspace=session.workspace)
        task = asyncio.ensure_future(tool.handler(args, context))
        with self._inflight.track((session_key(session.id), *abort_keys), lambda: _cancel(task)):
            try:
                output = await task
            except asyncio.CancelledError:
                if task.cancelled() and not _current_task_cancelling():
                    return fail("aborted", "call aborted: the session or route was revoked")
                raise
            except ToolError as exc:
                return fail("error", str(exc) or "tool failed")
            except Exception:
                logger.exception("tool %s raised", tool.name)
                return fail("error", f"{tool.name} failed with an internal error")
        text = output.text
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[truncated: result was {len(output.text)} characters]"
        structured = output.structured
        if structured is not None and len(json.dumps(structured, default=str)) > MAX_RESULT_CHARS:
            structured = None
        return CallOutcome(
            tool=tool.name,
            status="ok",
            text=text,
            structured=structured,
            decision=decision,
            source=tool.source,
            server=tool.server,
        )

    def _record(
        self,
        session: Session,
        tool: ToolDef | None,
        name: str,
        arguments: Mapping[str, Any] | None,
        outcome: CallOutcome,
        decision: Decision,
        started: float,
        via: str,
    ) -> None:
        try:
            self._audit.append(
                "tool.call",
                session=session.id,
                tool=name[:128],
                risk=tool.risk.value if tool is not None else None,
                decision=decision.verdict.value,
                rule=decision.rule,
                via=via,
                outcome=outcome.status,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                args=shape_of(dict(arguments or {})),
            )
        except Exception:
            # The audit write failing must not turn into a success the user cannot see: log loudly.
            logger.exception("audit append failed for a call to %s", name)


def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _clean_arguments(tool: ToolDef, arguments: Mapping[str, Any] | None) -> dict[str, Any] | str:
    """Drop fields the schema does not know (models invent them), then validate; a str is the error."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return "arguments must be an object"
    properties = tool.input_schema.get("properties", {})
    if tool.input_schema.get("additionalProperties") is True:
        args = dict(arguments)
    else:
        args = {k: v for k, v in arguments.items() if k in properties}
    errors = sorted(tool.validator.iter_errors(args), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "arguments"
        return f"invalid arguments: {where}: {first.message[:200]}"
    return args
