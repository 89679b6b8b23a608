"""The one decision, as a table: mode x risk x grant x network x phase."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.auth.sessions import Mode, Session
from sidecar.bus.policy import Phase, Verdict, decide
from sidecar.bus.registry import CallContext, Risk, ToolDef, ToolOutput, ToolRegistry


async def _noop(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
    return ToolOutput(text="")


def _tool(name: str, risk: Risk, *, network: bool = False) -> ToolDef:
    return ToolRegistry().add(name=name, description="d", risk=risk, handler=_noop, needs_network=network)


def _session(mode: Mode = Mode.DEFAULT, allow: tuple[str, ...] = ("*",), network: bool = True) -> Session:
    return Session("s_x", "p", "/tmp", mode, allow, network, 0, 10**10)


@pytest.mark.parametrize(
    ("mode", "risk", "phase", "verdict"),
    [
        (Mode.READ_ONLY, Risk.LOW, Phase.LIST, Verdict.ALLOW),
        (Mode.READ_ONLY, Risk.LOW, Phase.CALL, Verdict.ALLOW),
        (Mode.READ_ONLY, Risk.MEDIUM, Phase.LIST, Verdict.DENY),
        (Mode.READ_ONLY, Risk.MEDIUM, Phase.CALL, Verdict.DENY),
        (Mode.DEFAULT, Risk.LOW, Phase.CALL, Verdict.ALLOW),
        (Mode.DEFAULT, Risk.MEDIUM, Phase.LIST, Verdict.ALLOW),
        (Mode.DEFAULT, Risk.MEDIUM, Phase.CALL, Verdict.ASK),
        (Mode.BYPASS, Risk.MEDIUM, Phase.CALL, Verdict.ALLOW),
        (Mode.BYPASS, Risk.HIGH, Phase.LIST, Verdict.DENY),
        (Mode.BYPASS, Risk.HIGH, Phase.CALL, Verdict.DENY),
        (Mode.DEFAULT, Risk.HIGH, Phase.SEARCH, Verdict.DENY),
    ],
)
def test_mode_and_risk(mode: Mode, risk: Risk, phase: Phase, verdict: Verdict) -> None:
    assert decide(_session(mode), _tool("t", risk), phase).verdict is verdict


def test_unknown_tool_is_denied_by_the_exists_rule() -> None:
    decision = decide(_session(), None, Phase.CALL)
    assert (decision.verdict, decision.rule) == (Verdict.DENY, "exists")


@pytest.mark.parametrize(
    ("allow", "verdict"),
    [
        (("*",), Verdict.ALLOW),
        (("calc",), Verdict.ALLOW),
        (("other",), Verdict.DENY),
        ((), Verdict.DENY),
        (("mcp__sidecar__*",), Verdict.DENY),
    ],
)
def test_grant_patterns_for_builtins(allow: tuple[str, ...], verdict: Verdict) -> None:
    assert decide(_session(allow=allow), _tool("calc", Risk.LOW), Phase.CALL).verdict is verdict


def test_network_tools_need_the_network_grant() -> None:
    tool = _tool("fetch", Risk.LOW, network=True)
    assert decide(_session(network=False), tool, Phase.LIST).rule == "network"
    assert decide(_session(network=True), tool, Phase.LIST).verdict is Verdict.ALLOW


def test_risk_is_fixed_at_definition() -> None:
    tool = _tool("t", Risk.LOW)
    with pytest.raises(AttributeError):
        tool.risk = Risk.HIGH  # type: ignore[misc]
