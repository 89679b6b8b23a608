"""What a connector declares for sidecar itself: that it works offline, which tools to defer, what costs money.

Issue 10, items 2 and 3 at the manifest seam: ``connector.json`` ``"network": false``, an entry's
``"sidecarNetwork": false`` and ``"defer_loading"`` (true, false or a list, on an entry or a whole file),
the trust key that pins an offline declaration, and a connector's own ``high-credit-tools.json`` in the
billable gate under its own scope and names.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sidecar.bus.billing import BillingGate, ManifestSource, read_source
from sidecar.connectors.manifest.models import ConnectorFile
from sidecar.connectors.manifest.sources import ConnectorSpec, load_package, load_plugin, load_user_servers
from sidecar.connectors.manifest.trustkey import canonical_launch, trust_key
from sidecar.connectors.proxy import Deferral, billing_sources
from sidecar.errors import ConfigError
from tests.helpers import write_config

ENTRY: dict[str, Any] = {"command": sys.executable, "args": ["server.py"]}
CONNECTOR: dict[str, Any] = {"id": "files", "name": "Files", "type": "mcp"}
PAID = {"version": 1, "tools": {"render": {"approvalKind": "image-generation", "group": "images"}}}


def _user(tmp_path: Path, servers: dict[str, Any], **top: Any) -> tuple[list[ConnectorSpec], list[str]]:
    path = write_config(tmp_path / "mcp.json", {"mcpServers": servers, **top})
    specs, problems = load_user_servers(path)
    return specs, [p.message for p in problems]


def _package(tmp_path: Path, connector: dict[str, Any], entry: dict[str, Any]) -> Path:
    directory = tmp_path / "files"
    write_config(directory / "connector.json", connector)
    write_config(directory / "mcp.json", {"mcpServers": {"files": entry}})
    write_config(directory / "server.py", "")
    return directory


# -- the network -------------------------------------------------------------------------------------


def test_a_connector_needs_the_network_unless_it_declares_it_works_offline(tmp_path: Path) -> None:
    specs, problems = _user(tmp_path, {"web": ENTRY, "local": {**ENTRY, "sidecarNetwork": False}})
    assert problems == []
    assert {s.id: s.network for s in specs} == {"web": True, "local": False}
    assert load_package(_package(tmp_path, CONNECTOR, ENTRY)).network is True
    assert load_package(_package(tmp_path, {**CONNECTOR, "network": False}, ENTRY)).network is False


def test_a_package_declares_the_network_in_its_connector_file_not_its_entry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"mcpServers\.files\.sidecarNetwork.*connector\.json"):
        load_package(_package(tmp_path, CONNECTOR, {**ENTRY, "sidecarNetwork": False}))
    with pytest.raises(ConfigError, match=r"connector\.json: network"):
        load_package(_package(tmp_path, {**CONNECTOR, "network": "no"}, ENTRY))


def test_declaring_a_connector_offline_changes_its_trust_key_and_nothing_else_does(tmp_path: Path) -> None:
    [online], _ = _user(tmp_path, {"local": ENTRY})
    offline = dataclasses.replace(online, network=False)
    assert trust_key(offline) != trust_key(online)  # the user must trust it again to widen who may use it
    assert b"offline" not in canonical_launch(online)  # keys of connectors that need the network are as before
    deferring = dataclasses.replace(online, defer_loading=True)
    assert trust_key(deferring) == trust_key(online)  # deferral widens nothing


# -- deferral ----------------------------------------------------------------------------------------


def test_defer_loading_is_honoured_on_an_entry_or_a_whole_file(tmp_path: Path) -> None:
    servers = {
        "all": {**ENTRY, "defer_loading": True},
        "none": {**ENTRY, "defer_loading": False},
        "some": {**ENTRY, "defer_loading": ["render", "upscale"]},
        "silent": ENTRY,
    }
    specs, problems = _user(tmp_path, servers)
    assert problems == []
    found = {s.id: s.defer_loading for s in specs}
    assert found == {"all": True, "none": False, "some": frozenset({"render", "upscale"}), "silent": None}
    specs, problems = _user(tmp_path, {"a": ENTRY, "b": {**ENTRY, "defer_loading": True}}, defer_loading=False)
    assert problems == [] and {s.id: s.defer_loading for s in specs} == {"a": False, "b": True}


def test_a_plugins_mcp_json_may_declare_defer_loading(tmp_path: Path) -> None:
    plugin = tmp_path / "studio"
    write_config(plugin / ".mcp.json", {"mcpServers": {"render": {**ENTRY, "defer_loading": ["upscale"]}}})
    write_config(plugin / "high-credit-tools.json", PAID)
    [spec], problems = load_plugin(plugin)
    assert problems == []
    assert (spec.id, spec.defer_loading) == ("studio-render", frozenset({"upscale"}))
    write_config(plugin / ".mcp.json", {"mcpServers": {"render": ENTRY}, "defer_loading": False})
    [spec], problems = load_plugin(plugin)
    assert problems == [] and spec.defer_loading is False


@pytest.mark.parametrize(
    ("value", "what"),
    [("yes", "defer_loading"), (["a", "a"], "names a tool twice"), (["has space"], "not a valid tool name"), (1, "")],
)
def test_a_wrong_defer_loading_names_the_entry_and_the_field(tmp_path: Path, value: Any, what: str) -> None:
    specs, problems = _user(tmp_path, {"bad": {**ENTRY, "defer_loading": value}, "good": ENTRY})
    assert [s.id for s in specs] == ["good"]
    [problem] = problems
    assert "mcpServers.bad.defer_loading" in problem and what in problem


@pytest.mark.parametrize(
    ("deferral", "declared", "deferred"),
    [
        (Deferral(), None, {"render": True, "upscale": True}),  # connector tools are deferred by default
        (Deferral(default=False), None, {"render": False, "upscale": False}),
        (Deferral(), False, {"render": False, "upscale": False}),  # what the connector says beats the default
        (Deferral(default=False), True, {"render": True, "upscale": True}),
        (Deferral(), frozenset({"upscale"}), {"render": False, "upscale": True}),
        (Deferral(direct=frozenset({"studio"})), True, {"render": False, "upscale": False}),  # the user's word
    ],
)
def test_which_connector_tools_are_deferred(
    tmp_path: Path, deferral: Deferral, declared: bool | frozenset[str] | None, deferred: dict[str, bool]
) -> None:
    [spec], _ = _user(tmp_path, {"studio": ENTRY})
    spec = dataclasses.replace(spec, defer_loading=declared)
    assert {tool: deferral.deferred(spec, tool) for tool in deferred} == deferred


# -- the billable gate -------------------------------------------------------------------------------


def test_a_connectors_manifest_covers_its_own_scope_by_its_own_names(tmp_path: Path) -> None:
    plugin = tmp_path / "studio"
    write_config(plugin / ".mcp.json", {"mcpServers": {"render": ENTRY}})
    manifest = write_config(plugin / "high-credit-tools.json", PAID)
    [spec], _ = load_plugin(plugin)
    [source] = billing_sources(spec)
    assert source.scope == "connector:studio-render"
    gate = BillingGate([])
    gate.cover(source.scope, [source])
    paid = gate.check(scope="connector:studio-render", tool="mcp__studio-render__render")
    assert (paid.billable, paid.kind, paid.group) == (True, "image-generation", "studio-render/images")  # its own group
    assert not gate.check(scope="connector:studio-render", tool="mcp__studio-render__upscale").billable
    assert not gate.check(scope="builtin", tool="render").billable  # another scope: not its names
    assert not gate.check(scope="connector:other", tool="mcp__other__render").billable
    tools, problem = read_source(source)  # what `connectors show` reports
    assert (list(tools), tools["render"].group, problem) == (["render"], "images", None)

    manifest.write_text('{"version": 1, "tools": {"render": {"approvalKind": "x"}}}')  # schema-invalid
    gate = BillingGate([])  # (a fresh gate: no recheck interval to wait out)
    gate.cover(source.scope, [source])
    for tool in ("render", "upscale"):  # fail closed: every tool of that connector asks, never remembered
        closed = gate.check(scope="connector:studio-render", tool=f"mcp__studio-render__{tool}")
        assert (closed.billable, closed.kind, closed.group) == (True, "unverifiable", None)
    tools, problem = read_source(source)
    assert tools == {} and problem is not None and "group" in problem and str(manifest) in problem
    gate.cover(source.scope, [])  # withdrawn: its broken manifest no longer makes anything ask
    assert not gate.check(scope="connector:studio-render", tool="mcp__studio-render__render").billable


def test_a_user_server_has_no_manifest_of_its_own(tmp_path: Path) -> None:
    [spec], _ = _user(tmp_path, {"local": ENTRY})
    assert billing_sources(spec) == []
    with pytest.raises(ValueError, match="every source must cover"):
        BillingGate([]).cover("builtin", [ManifestSource(scope="other", path=tmp_path / "x", required=False)])


def test_a_user_entry_declares_its_billable_tools_and_they_ask_in_their_own_group(tmp_path: Path) -> None:
    billable = {"approvalKind": "image-generation", "group": "images"}
    tools = {"render": {"risk": "LOW", "billable": billable}, "upscale": {"risk": "LOW"}}
    [spec], problems = _user(tmp_path, {"local": {**ENTRY, "tools": tools}})
    assert problems == []
    [source] = billing_sources(spec)
    gate = BillingGate([])
    gate.cover(source.scope, [source])
    paid = gate.check(scope="connector:local", tool="mcp__local__render")
    assert (paid.billable, paid.kind, paid.group) == (True, "image-generation", "local/images")
    assert not gate.check(scope="connector:local", tool="mcp__local__upscale").billable
    assert read_source(source) == ({"render": spec.tool_billing["render"]}, None)


def test_a_package_cannot_declare_billable_tools_in_connector_json() -> None:
    billable = {"approvalKind": "credits", "group": "api"}
    with pytest.raises(ValidationError, match=r"high-credit-tools\.json"):
        ConnectorFile.model_validate(
            {"id": "pkg", "name": "P", "type": "mcp", "tools": {"t": {"risk": "LOW", "billable": billable}}}
        )
