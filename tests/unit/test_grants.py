"""Grants and the network, decided in one place: what a session may use of the built-ins and of each connector.

Issue 10, items 1, 2 and 4 at the seams: ``policy`` (the grant patterns, the network, a connector as a whole),
the session's default grant, the control API's choice of grant, the settings, the deferred-tools hint and
what a session that cannot search gets listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.sessions import Mode, Session, SessionStore, validate_pattern
from sidecar.bus.approvals import ApprovalStore
from sidecar.bus.deferral import DeferPolicy
from sidecar.bus.policy import Phase, Verdict, decide, grants_connector, reaches_connector
from sidecar.bus.registry import CallContext, Risk, ToolDef, ToolOutput, ToolRegistry
from sidecar.bus.tools import ToolService
from sidecar.config import load_settings
from sidecar.control import NewSession
from sidecar.edge.mcp import HINT_TOOLS, deferred_hint
from sidecar.errors import ConfigError, RequestRejected
from sidecar.names import BUILTIN_GRANT, connector_route
from sidecar.store.audit import AuditLog


async def _noop(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
    return ToolOutput(text="")


def _session(allow: tuple[str, ...], *, network: bool = True, mode: Mode = Mode.BYPASS) -> Session:
    return Session("s_x", "p", "/tmp", mode, allow, network, 0, 10**10)


def _builtin(registry: ToolRegistry, name: str) -> ToolDef:
    return registry.add(name=name, description=f"{name} does things", risk=Risk.LOW, handler=_noop)


def _connector_tool(registry: ToolRegistry, connector: str, tool: str, *, network: bool = True) -> ToolDef:
    return registry.add(
        name=f"mcp__{connector}__{tool}",
        description=f"{tool} of {connector}",
        risk=Risk.LOW,
        handler=_noop,
        needs_network=network,
        source=connector_route(connector),
        server=connector,
    )


# -- item 1: no grant, no connector tools -------------------------------------------------------------


@pytest.mark.parametrize(
    ("allow", "builtin", "alpha", "beta"),
    [
        ((BUILTIN_GRANT,), True, False, False),  # the default: every built-in, no connector
        (("*",), True, True, True),
        (("mcp__alpha__*",), False, True, False),
        ((BUILTIN_GRANT, "mcp__alpha__*"), True, True, False),
        (("mcp__alpha__read",), False, True, False),
        (("calc",), True, False, False),
        (("read",), False, False, False),  # a connector tool's own name is not its pool name
        ((), False, False, False),
    ],
)
def test_the_grant_covers_built_ins_and_connectors_only_as_its_patterns_say(
    allow: tuple[str, ...], builtin: bool, alpha: bool, beta: bool
) -> None:
    registry = ToolRegistry()
    tools = {
        "builtin": _builtin(registry, "calc"),
        "alpha": _connector_tool(registry, "alpha", "read"),
        "beta": _connector_tool(registry, "beta", "read"),
    }
    session = _session(allow)
    for which, granted in (("builtin", builtin), ("alpha", alpha), ("beta", beta)):
        for phase in Phase:
            decision = decide(session, tools[which], phase)
            assert decision.allowed is granted, (which, phase, decision)
            assert granted or decision.rule == "grant"


def test_the_default_grant_is_the_built_ins_and_is_a_valid_pattern_that_names_no_tool(tmp_path: Path) -> None:
    store = SessionStore(InflightTracker(), default_ttl=3600, max_ttl=7200)
    session, _ = store.create(project_id="p", workspace=str(tmp_path))
    assert session.allow == (BUILTIN_GRANT,)
    assert validate_pattern(BUILTIN_GRANT) == BUILTIN_GRANT
    for wrong in ("builtin:", "builtin:calc", "builtin*", "connector:alpha"):
        with pytest.raises(RequestRejected, match=r"builtin:\*"):
            validate_pattern(wrong)
    with pytest.raises(ValueError, match="invalid tool name"):
        ToolRegistry().add(name=BUILTIN_GRANT, description="", risk=Risk.LOW, handler=_noop)


@pytest.mark.parametrize(
    ("body", "grant"),
    [
        ({}, ("builtin:*",)),
        ({"allow": ["*"]}, ("*",)),
        ({"allow": []}, ()),
        ({"connector": "alpha"}, ("mcp__alpha__*",)),  # --connector ID is a grant of that connector
        ({"connector": "alpha", "allow": ["mcp__alpha__read"]}, ("mcp__alpha__read",)),  # ...unless narrowed
    ],
)
def test_a_new_session_gets_the_default_grant_unless_it_asks_for_one(
    body: dict[str, Any], grant: tuple[str, ...]
) -> None:
    spec = NewSession.model_validate({"workspace": "/tmp", **body})
    assert spec.grant(("builtin:*",)) == grant


def test_the_default_grant_is_a_setting_checked_when_read(tmp_path: Path) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text('[sessions]\ndefault_allow = ["builtin:*", "mcp__workspace__*"]\n')
    assert load_settings(file, env={}).sessions.default_allow == ("builtin:*", "mcp__workspace__*")
    file.write_text('[sessions]\ndefault_allow = ["mcp__Bad__*"]\n')
    with pytest.raises(ConfigError, match=r"sessions\.default_allow") as err:
        load_settings(file, env={})
    assert str(file) in str(err.value)
    file.write_text('[tools]\ndirect_connectors = ["Not An Id"]\n')
    with pytest.raises(ConfigError, match=r"tools\.direct_connectors"):
        load_settings(file, env={})


# -- item 2: the network -----------------------------------------------------------------------------


@pytest.mark.parametrize("network", [True, False])
def test_a_connector_tool_that_needs_the_network_is_denied_without_it_and_an_offline_one_is_not(
    network: bool,
) -> None:
    registry = ToolRegistry()
    online = _connector_tool(registry, "web", "fetch", network=True)
    offline = _connector_tool(registry, "files", "read", network=False)
    session = _session(("*",), network=network)
    for phase in Phase:
        assert decide(session, offline, phase).allowed
        decision = decide(session, online, phase)
        assert decision.allowed is network and (network or decision.rule == "network")


@pytest.mark.parametrize(
    ("allow", "network", "needs", "whole", "some"),
    [
        (("*",), True, True, True, True),
        (("*",), False, True, False, False),  # a connector that needs the network: none of it, not even named
        (("*",), False, False, True, True),  # one that works offline
        (("mcp__alpha__*",), True, True, True, True),
        (("mcp__alpha__read",), True, True, False, True),  # one tool: the connector, not its resources
        (("mcp__alpha__read",), False, True, False, False),
        (("mcp__beta__*", "mcp__alphabet__*"), True, True, False, False),  # no prefix match
        ((BUILTIN_GRANT,), True, True, False, False),
        ((BUILTIN_GRANT,), True, False, False, False),
    ],
)
def test_whether_a_session_may_use_a_connector_at_all_or_whole(
    allow: tuple[str, ...], network: bool, needs: bool, whole: bool, some: bool
) -> None:
    session = _session(allow, network=network)
    assert grants_connector(session, "alpha", needs_network=needs) is whole
    assert reaches_connector(session, "alpha", needs_network=needs) is some


# -- item 4: what an agent is told ---------------------------------------------------------------------


def test_the_hint_names_only_the_deferred_tools_it_is_given_and_stays_bounded() -> None:
    registry = ToolRegistry()
    tools = [_connector_tool(registry, "alpha", f"tool{i}") for i in range(HINT_TOOLS + 5)]
    tools.append(_builtin(registry, "calc"))
    hint = deferred_hint(tools)
    assert "tool_search" in hint and "tool_call" in hint
    assert "alpha (65 tools)" in hint and "sidecar (1 tool)" in hint
    assert "mcp__alpha__tool0: tool0 of alpha" in hint and f"mcp__alpha__tool{HINT_TOOLS - 1}" in hint
    assert f"mcp__alpha__tool{HINT_TOOLS}" not in hint and "and 6 more" in hint
    assert deferred_hint([]) == ""
    long = registry.add(name="wordy", description="word " * 500, risk=Risk.LOW, handler=_noop)
    assert len(deferred_hint([long])) < 400


def _service(tmp_path: Path, registry: ToolRegistry) -> ToolService:
    inflight = InflightTracker()
    return ToolService(
        registry,
        sessions=SessionStore(inflight, default_ttl=3600, max_ttl=7200),
        audit=AuditLog(tmp_path / "audit.jsonl"),
        inflight=inflight,
        approvals=ApprovalStore(),
        defer=DeferPolicy(),
    )


def test_a_session_that_cannot_search_gets_its_deferred_tools_listed(tmp_path: Path) -> None:
    registry = ToolRegistry()
    for name in ("tool_search", "tool_call", "calc"):
        _builtin(registry, name)
    registry.add(
        name="mcp__alpha__read",
        description="read",
        risk=Risk.LOW,
        handler=_noop,
        defer_loading=True,
        source=connector_route("alpha"),
        server="alpha",
    )
    service = _service(tmp_path, registry)
    listed, deferred = service.partition(_session(("*",)))
    assert [t.name for t in deferred] == ["mcp__alpha__read"]
    assert "mcp__alpha__read" not in [t.name for t in listed]
    # Without tool_search and tool_call nothing could reach a deferred tool, so nothing is deferred.
    for allow in (("mcp__alpha__*",), ("mcp__alpha__*", "tool_search"), ("mcp__alpha__*", "tool_call")):
        listed, deferred = service.partition(_session(allow))
        assert "mcp__alpha__read" in [t.name for t in listed] and deferred == [], allow
    assert service.search(_session(("*",)), "read")[0].name == "mcp__alpha__read"


def test_the_verdict_of_a_tool_outside_the_grant_is_deny_by_the_grant_rule() -> None:
    registry = ToolRegistry()
    tool = _connector_tool(registry, "alpha", "read")
    decision = decide(_session((BUILTIN_GRANT,)), tool, Phase.CALL)
    assert (decision.verdict, decision.rule) == (Verdict.DENY, "grant")
