"""ToolService without HTTP: argument handling, failures as results, truncation, approvals' lifetimes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.sessions import Session, SessionStore, session_key
from sidecar.bus.approvals import ApprovalState, ApprovalStore, arguments_digest
from sidecar.bus.bounds import DEFAULT_MAX_RESULT_CHARS
from sidecar.bus.builtins import install_builtins
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry
from sidecar.bus.tools import ToolService
from sidecar.errors import Conflict
from sidecar.store.audit import AuditLog


class Box:
    seen: dict[str, Any] | None = None


def _service(tmp_path: Path, registry: ToolRegistry) -> tuple[ToolService, Session]:
    inflight = InflightTracker()
    sessions = SessionStore(inflight, default_ttl=3600, max_ttl=7200)
    session, _ = sessions.create(project_id="p", workspace=str(tmp_path), mode="bypass")
    audit = AuditLog(tmp_path / "state" / "audit.jsonl")
    service = ToolService(registry, sessions=sessions, audit=audit, inflight=inflight, approvals=ApprovalStore())
    return service, session


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    async def strict(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        Box.seen = arguments
        return ToolOutput(text="ok")

    async def open_ended(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        Box.seen = arguments
        return ToolOutput(text="ok")

    async def boom(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        raise RuntimeError("secret internal detail /etc/shadow")

    async def huge(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        return ToolOutput(text="x" * (DEFAULT_MAX_RESULT_CHARS + 10))

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    registry.add(name="strict", description="d", risk=Risk.LOW, handler=strict, parameters=schema)
    registry.add(
        name="open_ended",
        description="d",
        risk=Risk.LOW,
        handler=open_ended,
        parameters={**schema, "additionalProperties": True},
    )
    registry.add(name="boom", description="d", risk=Risk.LOW, handler=boom)
    registry.add(name="huge", description="d", risk=Risk.LOW, handler=huge)
    return registry


async def test_invented_fields_are_dropped_but_an_open_schema_gets_them(tmp_path: Path) -> None:
    service, session = _service(tmp_path, _registry())
    outcome = await service.call(session, "strict", {"a": 1, "invented": True}, via="test")
    assert outcome.status == "ok" and Box.seen == {"a": 1}
    outcome = await service.call(session, "open_ended", {"a": 1, "invented": True}, via="test")
    assert outcome.status == "ok" and Box.seen == {"a": 1, "invented": True}


@pytest.mark.parametrize("arguments", [{}, {"a": "one"}, {"a": 1.5}, ["a"]])
async def test_bad_arguments_are_an_error_result(tmp_path: Path, arguments: Any) -> None:
    service, session = _service(tmp_path, _registry())
    outcome = await service.call(session, "strict", arguments, via="test")
    assert outcome.is_error and outcome.status == "error"
    assert outcome.text.startswith(("invalid arguments", "arguments must be an object"))


async def test_a_throwing_tool_is_an_error_result_without_internals(tmp_path: Path) -> None:
    service, session = _service(tmp_path, _registry())
    outcome = await service.call(session, "boom", {}, via="test")
    assert outcome.status == "error" and outcome.text == "boom failed with an internal error"
    assert "shadow" not in outcome.text


async def test_an_oversized_result_is_truncated_with_a_marker(tmp_path: Path) -> None:
    service, session = _service(tmp_path, _registry())
    outcome = await service.call(session, "huge", {}, via="test")
    assert outcome.status == "ok"
    assert outcome.text.startswith("x" * DEFAULT_MAX_RESULT_CHARS + "\n[truncated: 10 of ")


async def test_unknown_and_denied_look_the_same(tmp_path: Path) -> None:
    registry = _registry()

    async def hidden(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        return ToolOutput(text="never")

    registry.add(name="hidden_high", description="d", risk=Risk.HIGH, handler=hidden)
    service, session = _service(tmp_path, registry)
    unknown = await service.call(session, "nope", {}, via="test")
    denied = await service.call(session, "hidden_high", {}, via="test")
    assert (unknown.status, unknown.text) == (denied.status, denied.text)


def test_an_approval_expires_and_then_cannot_be_spent() -> None:
    now = [1000.0]
    store = ApprovalStore(clock=lambda: now[0], ttl=60)
    digest = arguments_digest({"a": 1})
    approval = store.request(session_id="s", tool="t", digest=digest, kind="confirm", group="tool:t")
    store.allow(approval.id)
    now[0] += 61
    assert store.consume(session_id="s", tool="t", digest=digest, group=None) is None
    assert store.get(approval.id).state is ApprovalState.EXPIRED
    with pytest.raises(Conflict):
        store.allow(approval.id)


def test_a_pending_approval_is_reused_for_the_same_call_and_distinct_for_other_arguments() -> None:
    store = ApprovalStore()
    one = store.request(session_id="s", tool="t", digest=arguments_digest({"a": 1}), kind="k", group="g")
    again = store.request(session_id="s", tool="t", digest=arguments_digest({"a": 1}), kind="k", group="g")
    other = store.request(session_id="s", tool="t", digest=arguments_digest({"a": 2}), kind="k", group="g")
    assert one.id == again.id and one.id != other.id


def test_remembering_is_per_session_and_group() -> None:
    store = ApprovalStore()
    store.remember("s1", "images")
    assert store.consume(session_id="s1", tool="t", digest="d", group="images") == "remembered"
    assert store.consume(session_id="s1", tool="t", digest="d", group="video") is None
    assert store.consume(session_id="s2", tool="t", digest="d", group="images") is None


def test_argument_digest_ignores_key_order() -> None:
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": "1"})


# -- revocation: the call is aborted in the task it runs in, and that task carries on --------------------


ROUTE = ("route", "test")


class Gate:
    """A tool body that waits until released, and records whether the cancellation reached it."""

    def __init__(self, *, swallow: bool = False) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False
        self.swallow = swallow

    async def handler(self, arguments: dict[str, Any], call: CallContext) -> ToolOutput:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            if not self.swallow:
                raise
        return ToolOutput(text="finished")


def _gated(gate: Gate, tmp_path: Path) -> ToolRegistry:
    registry = ToolRegistry()
    registry.add(name="wait", description="d", risk=Risk.LOW, handler=gate.handler)
    install_builtins(registry, notes_dir=tmp_path / "notes")
    return registry


async def _call_then(service: ToolService, session: Session, name: str, arguments: dict[str, Any]) -> tuple[Any, int]:
    """Run one call; then show the task is usable: it awaits again and has no cancellation pending."""
    outcome = await service.call(session, name, arguments, via="test", abort_keys=[ROUTE])
    await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None
    return outcome, task.cancelling()


@pytest.mark.parametrize("swallow", [False, True], ids=["tool-ends", "tool-swallows-the-cancel"])
async def test_a_revoked_call_is_aborted_and_its_task_carries_on(tmp_path: Path, swallow: bool) -> None:
    gate = Gate(swallow=swallow)
    service, session = _service(tmp_path, _gated(gate, tmp_path))
    call = asyncio.create_task(_call_then(service, session, "wait", {}))
    await asyncio.wait_for(gate.entered.wait(), 10)

    # The call is registered under its session and its route: revoking both is one abort.
    assert service._inflight.abort(session_key(session.id)) == 1
    assert service._inflight.abort(ROUTE) == 1
    outcome, cancelling = await asyncio.wait_for(call, 10)

    assert gate.cancelled
    assert (outcome.status, outcome.text) == ("aborted", "call aborted: the session or route was revoked")
    assert cancelling == 0
    assert not call.cancelled()


async def test_a_revoked_call_inside_tool_call_aborts_the_outer_call_and_the_task_carries_on(tmp_path: Path) -> None:
    gate = Gate()
    service, session = _service(tmp_path, _gated(gate, tmp_path))
    call = asyncio.create_task(_call_then(service, session, "tool_call", {"name": "wait"}))
    await asyncio.wait_for(gate.entered.wait(), 10)

    assert service._inflight.abort(session_key(session.id)) == 2  # the outer and the inner call
    outcome, cancelling = await asyncio.wait_for(call, 10)

    assert (outcome.tool, outcome.status) == ("tool_call", "aborted")
    assert cancelling == 0
    outcomes = [r["outcome"] for r in _audit_records(tmp_path) if r["event"] == "tool.call"]
    assert outcomes == ["aborted", "aborted"]


@pytest.mark.parametrize("also_revoked", [False, True], ids=["caller-only", "caller-and-revocation"])
async def test_a_cancelled_caller_stays_cancelled_and_the_call_is_audited(tmp_path: Path, also_revoked: bool) -> None:
    gate = Gate()
    service, session = _service(tmp_path, _gated(gate, tmp_path))
    call = asyncio.create_task(service.call(session, "wait", {}, via="test"))
    await asyncio.wait_for(gate.entered.wait(), 10)

    call.cancel()
    if also_revoked:
        service._inflight.abort(session_key(session.id))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 10)

    assert call.cancelled()
    assert [r["outcome"] for r in _audit_records(tmp_path) if r["event"] == "tool.call"] == ["aborted"]
    assert service._inflight.count(session_key(session.id)) == 0


async def test_an_unrevoked_call_leaves_its_task_untouched(tmp_path: Path) -> None:
    gate = Gate()
    gate.release.set()
    service, session = _service(tmp_path, _gated(gate, tmp_path))

    outcome, cancelling = await _call_then(service, session, "wait", {})

    assert (outcome.status, outcome.text, cancelling) == ("ok", "finished", 0)
    assert service._inflight.count(session_key(session.id)) == 0


def _audit_records(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "state" / "audit.jsonl").read_bytes().splitlines()
    return [json.loads(line) for line in lines]
