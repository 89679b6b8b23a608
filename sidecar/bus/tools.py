"""Running tools for a session: the decision, argument checks, approvals, execution, results, audit.

``ToolService.call`` never raises to the caller: an unknown or forbidden tool, bad arguments, a call
that needs approval, a tool that throws, or a call aborted by revocation each become a ``CallOutcome``
with ``is_error`` and a short message (contract §6). A denied call and a call to a tool that does not
exist get the same message, so names cannot be probed. Every result is bounded for the agent's context
window (``bus/bounds.py``).

Every call is decided again at execution time, and once more after any wait for a human, from the
live session record: a grant that shrank or a session that ended while a question was open wins.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.sessions import Session, SessionStore, session_key
from sidecar.bus.approvals import ApprovalStore, arguments_digest, arguments_shown
from sidecar.bus.asking import Answer, Asker, Question
from sidecar.bus.bounds import DEFAULT_MAX_RESULT_CHARS, bound_output
from sidecar.bus.deferral import DeferPolicy
from sidecar.bus.policy import FREE, Billing, Decision, Phase, Verdict, decide
from sidecar.bus.registry import CallContext, Progress, Risk, ToolDef, ToolHandler, ToolRegistry
from sidecar.bus.search import SearchIndex
from sidecar.bus.shapes import shape_of
from sidecar.bus.untrusted import marked
from sidecar.errors import ToolError
from sidecar.names import connector_of_route
from sidecar.store.audit import AuditLog
from sidecar.text import preview

__all__ = ["OUTCOME_STATUSES", "BillingCheck", "CallOutcome", "ToolService"]

logger = logging.getLogger(__name__)

PREVIEW_CHARS: Final = 200
OUTCOME_STATUSES: Final = ("ok", "error", "denied", "approval_required", "declined", "aborted")
"""Every ``CallOutcome.status`` (the REST facade's OpenAPI document lists them)."""
NOT_AVAILABLE: Final = "tool not found or not available in this session"
REVOKED: Final = "call aborted: the session or route was revoked"


class BillingCheck(Protocol):
    """The billable gate's interface (``bus/billing.py``); must never raise."""

    def check(self, *, scope: str, tool: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """The normalized result of one call, whatever its route (the REST facade renders it as JSON)."""

    tool: str
    status: str
    """One of ``OUTCOME_STATUSES``."""
    text: str
    structured: Mapping[str, Any] | None = None
    source: str = "builtin"
    server: str = "sidecar"
    risk: Risk | None = None
    """The tool's risk; None when the call never reached a known tool."""
    decision: Decision | None = field(default=None, compare=False)
    approval_id: str | None = None
    content: tuple[Mapping[str, Any], ...] | None = None
    """MCP content blocks from a connector, passed through as they came."""
    raw: Mapping[str, Any] | None = None
    """A relayed connector's whole wire result (``ToolOutput.raw``)."""
    meta: Mapping[str, Any] | None = None
    """The result's ``_meta`` (a connector result's origin)."""

    @property
    def is_error(self) -> bool:
        return self.status != "ok"

    def preview(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return first[:PREVIEW_CHARS]


class _SessionBus:
    """``CallContext.bus`` for one call: search and call within the same session and asker."""

    def __init__(
        self,
        service: ToolService,
        session: Session,
        ask: Asker | None,
        keys: tuple[Hashable, ...],
        progress: Progress | None,
    ) -> None:
        self._service, self._session, self._ask, self._keys = service, session, ask, keys
        self._progress = progress

    def search(self, query: str, limit: int) -> list[ToolDef]:
        session = self._service.sessions.alive(self._session.id)
        return self._service.search(session, query, limit) if session is not None else []

    async def call(self, name: str, arguments: Mapping[str, Any]) -> CallOutcome:
        session = self._service.sessions.alive(self._session.id)
        if session is None:
            return CallOutcome(tool=name, status="aborted", text="this session has ended")
        return await self._service.call(
            session, name, arguments, via="tool_call", abort_keys=self._keys, ask=self._ask, progress=self._progress
        )


class ToolService:
    """The session-facing view of the registry: what a session sees, finds and may run."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        sessions: SessionStore,
        audit: AuditLog,
        inflight: InflightTracker,
        approvals: ApprovalStore,
        billing: BillingCheck | None = None,
        defer: DeferPolicy | None = None,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        mark_connector_output: bool = True,
        console_url: Callable[[], str] = lambda: "http://127.0.0.1:<port>/ui/",
    ) -> None:
        """``max_result_chars`` bounds every result for the agent's context window (``bus/bounds.py``).
        ``console_url`` names the web console where a pending approval can be granted (issue 14 item 4:
        the message names both ways); the port is known only once the daemon listens."""
        self._registry = registry
        self.sessions = sessions
        self._audit = audit
        self._inflight = inflight
        self.approvals = approvals
        self._billing = billing
        self._defer = defer or DeferPolicy()
        self._max_result_chars = max_result_chars
        self._mark_connector_output = mark_connector_output
        self._console_url = console_url
        self._index = SearchIndex()
        self._indexed = -1
        self._indexed_tools: dict[str, ToolDef] = {}

    # -- what a session sees -------------------------------------------------------------------

    def visible(self, session: Session, phase: Phase = Phase.LIST) -> list[ToolDef]:
        """Every tool this session may see (listed or deferred), in registration order."""
        return [t for t in self._registry if decide(session, t, phase).verdict is not Verdict.DENY]

    def _pool_size(self, session: Session, *, cap: int) -> int:
        """How many tools the session may see, counting no further than ``cap`` (enough for auto-defer)."""
        visible = (t for t in self._registry if decide(session, t, Phase.LIST).verdict is not Verdict.DENY)
        return sum(1 for _ in itertools.islice(visible, cap))

    def partition(self, session: Session) -> tuple[list[ToolDef], list[ToolDef]]:
        """(listed, deferred): what ``tools/list`` shows, and the rest of what the session may see, which
        it finds with ``tool_search`` (``DeferPolicy.split``)."""
        return self._defer.split(self.visible(session))

    def listed(self, session: Session) -> list[ToolDef]:
        """What ``tools/list`` shows: the visible tools that are not deferred."""
        return self.partition(session)[0]

    def lookup(self, session: Session, name: str, phase: Phase = Phase.LIST) -> ToolDef | None:
        tool = self._registry.get(name)
        if tool is None or decide(session, tool, phase).verdict is Verdict.DENY:
            return None
        return tool

    def search(self, session: Session, query: str, limit: int = 10) -> list[ToolDef]:
        """Rank this session's *allowed, deferred* tools for ``query`` (BM25); others never appear."""
        self._refresh_index()
        pool_size = self._pool_size(session, cap=self._defer.auto_above + 1)

        def allowed(name: str) -> bool:
            tool = self._registry.get(name)
            return (
                tool is not None
                and decide(session, tool, Phase.SEARCH).verdict is not Verdict.DENY
                and self._defer.deferred(tool, pool_size)
            )

        hits = self._index.search(query, limit=limit, allowed=allowed)
        return [tool for name, _ in hits if (tool := self._registry.get(name)) is not None]

    def _refresh_index(self) -> None:
        if self._indexed == self._registry.version:
            return
        current = {t.name: t for t in self._registry if t.risk.value != "HIGH"}
        for name in [n for n in self._indexed_tools if current.get(n) is not self._indexed_tools[n]]:
            self._index.remove(name)
            del self._indexed_tools[name]
        for name, tool in current.items():
            if name not in self._indexed_tools:
                params = tool.input_schema.get("properties", {})
                self._index.add(name, name=name, description=tool.description, parameters=list(params))
                self._indexed_tools[name] = tool
        self._indexed = self._registry.version

    # -- running a call ------------------------------------------------------------------------

    def _billing_of(self, tool: ToolDef) -> Billing:
        if self._billing is None:
            return FREE
        try:
            verdict = self._billing.check(scope=tool.scope, tool=tool.name)
            return Billing(billable=bool(verdict.billable), kind=verdict.kind, group=verdict.group)
        except Exception:
            # SECURITY: the gate fails closed: an error in it means ask, never allow.
            logger.exception("billable gate failed for %s; asking", tool.name)
            return Billing(billable=True, kind="unverifiable", group=None)

    def decide_call(self, session: Session, name: str) -> tuple[ToolDef | None, Decision]:
        tool = self._registry.get(name)
        billing = self._billing_of(tool) if tool is not None else FREE
        return tool, decide(session, tool, Phase.CALL, billing)

    async def call(
        self,
        session: Session,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        via: str,
        abort_keys: Iterable[Hashable] = (),
        ask: Asker | None = None,
        progress: Progress | None = None,
        execute: ToolHandler | None = None,
    ) -> CallOutcome:
        """Decide, check arguments, get approval if needed, run and audit one call; never raises.

        ``execute`` runs instead of the tool's own handler, after the same decision and approvals: the
        faithful relay forwards the call's whole request to the connector this way.
        """
        started = time.perf_counter()
        tool, decision = self.decide_call(session, name)
        call = _Call(
            session=session,
            name=name,
            tool=tool,
            decision=decision,
            keys=(session_key(session.id), *abort_keys),
            via=via,
            ask=ask,
            progress=progress,
            execute=execute,
        )
        try:
            if tool is None or decision.verdict is Verdict.DENY:
                outcome = CallOutcome(tool=name, status="denied", text=NOT_AVAILABLE, decision=decision)
            else:
                args = _clean_arguments(tool, arguments)
                if isinstance(args, str):
                    outcome = call.fail("error", args)
                elif decision.verdict is Verdict.ASK:
                    outcome = await self._approve_then_run(call, args)
                else:
                    outcome = await self._run(call, args)
        except asyncio.CancelledError:
            # The caller went away (client disconnect, revocation): still leave a record of the call.
            self._record(call, arguments, CallOutcome(tool=name, status="aborted", text="call aborted"), started)
            raise
        self._record(call, arguments, outcome, started)
        return outcome

    async def _approve_then_run(self, call: _Call, args: dict[str, Any]) -> CallOutcome:
        tool, decision = call.known_tool, call.decision
        digest = arguments_digest(args)
        kind = decision.kind or "confirm"
        call.grant = self.approvals.consume(
            session_id=call.session.id, tool=tool.name, digest=digest, group=decision.group
        )
        if call.grant is None and call.ask is not None:
            answer = await self._ask(call.ask, Question(tool.name, kind, decision.group, _question_text(tool, kind)))
            if answer in (Answer.DECLINE, Answer.CANCEL):
                return call.fail("declined", f"the user declined {tool.name}")
            if answer is not None:
                if answer is Answer.ACCEPT_REMEMBER and decision.group is not None:
                    self.approvals.remember(call.session.id, decision.group)
                # SECURITY: a human may take minutes; decide again from the live session before running.
                live = self.sessions.alive(call.session.id)
                if live is None:
                    return call.fail("aborted", "this session has ended")
                call.session = live
                _, again = self.decide_call(live, tool.name)
                if again.verdict is Verdict.DENY:
                    return call.fail("denied", NOT_AVAILABLE, decision=again)
                call.grant = "elicited"
        if call.grant is None:
            approval = self.approvals.request(
                session_id=call.session.id,
                tool=tool.name,
                digest=digest,
                kind=kind,
                group=decision.group,
                arguments=arguments_shown(args),
            )
            remember = " (or add --remember session)" if decision.group is not None else ""
            text = (
                f"{tool.name} needs the user's approval ({kind}). Ask the user to allow it in the sidecar console "
                f"({self._console_url()}, opened with `sidecar ui`) or to run "
                f"`sidecar approvals allow {approval.id}`{remember}, then call it again with the same arguments."
            )
            return CallOutcome(
                tool=tool.name,
                status="approval_required",
                text=text,
                decision=decision,
                source=tool.source,
                server=tool.server,
                risk=tool.risk,
                approval_id=approval.id,
            )
        return await self._run(call, args)

    @staticmethod
    async def _ask(ask: Asker, question: Question) -> Answer | None:
        try:
            return await ask(question)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client could not be asked: fall back to a pending approval
            logger.info("could not ask through the client for %s: %s", question.tool, exc)
            return None

    async def _run(self, call: _Call, args: dict[str, Any]) -> CallOutcome:
        tool, session = call.known_tool, call.session
        context = CallContext(
            session_id=session.id,
            project_id=session.project_id,
            workspace=session.workspace,
            bus=_SessionBus(self, session, call.ask, call.keys[1:], call.progress),
            progress=call.progress,
        )
        revocation = _Revocation()
        failure: str | None = None
        with self._inflight.track(call.keys, revocation):
            try:
                output = await (call.execute or tool.handler)(args, context)
            except asyncio.CancelledError:
                if revocation.withdraw():
                    return call.fail("aborted", REVOKED)
                raise  # the caller was cancelled (client gone, shutdown), maybe as well: that wins
            except ToolError as exc:
                failure = str(exc) or "tool failed"
            except Exception:
                logger.exception("tool %s raised", tool.name)
                failure = f"{tool.name} failed with an internal error"
        if revocation.withdraw():  # revoked, and the tool caught the cancellation instead of ending
            return call.fail("aborted", REVOKED)
        if failure is not None:
            return call.fail("error", failure)
        if isinstance(output, CallOutcome):  # tool_call hands back the inner call's outcome as is
            return output
        output = bound_output(output, self._max_result_chars)
        connector_id = connector_of_route(tool.source)
        if connector_id is not None:
            # SECURITY: what a connector returns is data from elsewhere, never instructions: say so in it.
            output = marked(output, connector_id=connector_id, wrap=self._mark_connector_output)
        return CallOutcome(
            tool=tool.name,
            status="error" if output.is_error else "ok",
            text=output.text,
            structured=output.structured,
            decision=call.decision,
            source=tool.source,
            server=tool.server,
            risk=tool.risk,
            content=output.content,
            raw=output.raw,
            meta=output.meta,
        )

    def _record(self, call: _Call, arguments: Mapping[str, Any] | None, outcome: CallOutcome, started: float) -> None:
        tool = call.tool
        try:
            self._audit.append(
                "tool.call",
                session=call.session.id,
                tool=call.name[:128],
                risk=tool.risk.value if tool is not None else None,
                decision=call.decision.verdict.value,
                rule=call.decision.rule,
                grant=call.grant,
                via=call.via,
                outcome=outcome.status,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
                args=shape_of(dict(arguments or {})) if isinstance(arguments, Mapping) else "invalid",
            )
        except Exception:
            # The audit write failing must not turn into a success the user cannot see: log loudly.
            logger.exception("audit append failed for a call to %s", call.name)


@dataclass(slots=True)
class _Call:
    """The facts of one call as it moves from decision to approval to execution to its audit record."""

    session: Session
    """The live session record; replaced by a fresh one after waiting for a human."""
    name: str
    tool: ToolDef | None
    decision: Decision
    keys: tuple[Hashable, ...]
    """In-flight keys: revoking any of them (the session, the route) aborts the call."""
    via: str
    ask: Asker | None
    progress: Progress | None
    execute: ToolHandler | None
    grant: str | None = None
    """What let an asking call run: a consumed approval's id, ``session`` (remembered) or ``elicited``."""

    @property
    def known_tool(self) -> ToolDef:
        if self.tool is None:  # not an assert: the daemon runs with -OO, which strips them
            raise RuntimeError(f"{self.name}: only a call to a known tool gets this far")
        return self.tool

    def fail(self, status: str, text: str, *, decision: Decision | None = None) -> CallOutcome:
        tool = self.known_tool
        return CallOutcome(
            tool=tool.name,
            status=status,
            text=text,
            decision=decision or self.decision,
            source=tool.source,
            server=tool.server,
            risk=tool.risk,
        )


def _question_text(tool: ToolDef, kind: str) -> str:
    if kind == "confirm":
        return f"Allow the agent to run {tool.name}? {preview(tool.description, 200, quote=False)}"
    return f"{tool.name} costs money ({kind}). Allow this call? {preview(tool.description, 200, quote=False)}"


class _Revocation:
    """The abort callback of one running call: cancels the task the call runs in, as ``asyncio.timeout``
    does, and ``withdraw`` takes that cancellation back once it has ended the tool.

    Not a task per call: a task costs three event-loop turns a call on the hottest path. Nested calls
    (``tool_call``) share the task; each withdraws only its own cancellation, so the outermost revoked
    call reports the abort.
    """

    __slots__ = ("_fired", "_task")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._fired = False

    def __call__(self) -> None:
        # Idempotent: a call is registered under its route and its session, and both may be revoked.
        if not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel()

    def withdraw(self) -> bool:
        """Take our cancellation back; true when nobody else cancelled the task (the abort is ours)."""
        if not self._fired or self._task is None:
            return False
        self._fired = False
        return self._task.uncancel() == 0


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
        return f"invalid arguments: {where}: {preview(first.message, 200, quote=False)}"
    return args
