"""What a connector declares for its sandbox (issue 22 item 2): where it may say it, what it may say, and
the trust key that pins it. ``connector.json`` ``"sandbox"``; an entry's ``"sidecarSandbox"``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.connectors.manifest.sources import ConnectorSpec, load_package, load_plugin, load_user_servers
from sidecar.connectors.manifest.spec import Confinement
from sidecar.connectors.manifest.trustkey import canonical_launch
from sidecar.errors import ConfigError
from tests.helpers import write_config

ENTRY: dict[str, Any] = {"command": sys.executable, "args": ["server.py"], "cwd": "/srv/tool"}
CONNECTOR: dict[str, Any] = {"id": "files", "name": "Files", "type": "mcp"}


def _user(tmp_path: Path, **entries: Any) -> tuple[dict[str, ConnectorSpec], list[str]]:
    specs, problems = load_user_servers(write_config(tmp_path / "mcp.json", {"mcpServers": entries}))
    return {s.id: s for s in specs}, [p.message for p in problems]


def _package(tmp_path: Path, **connector: Any) -> ConnectorSpec:
    directory = tmp_path / "files"
    write_config(directory / "connector.json", {**CONNECTOR, **connector})
    write_config(directory / "mcp.json", {"mcpServers": {"files": ENTRY}})
    return load_package(directory)


def test_nothing_declared_is_no_workspace_no_path_and_sandboxed_where_there_is_one(tmp_path: Path) -> None:
    specs, problems = _user(tmp_path, plain=ENTRY)
    assert problems == [] and specs["plain"].sandbox == Confinement()
    assert b"sandbox" not in canonical_launch(specs["plain"])  # trusted before the sandbox: the same key


def test_an_entry_declares_its_workspace_and_paths_and_the_key_pins_them(tmp_path: Path) -> None:
    declared = {"workspace": "read", "readPaths": ["/opt/models"], "writePaths": ["/srv/cache"], "required": True}
    specs, problems = _user(tmp_path, tool={**ENTRY, "sidecarSandbox": declared}, other=ENTRY)
    assert problems == []
    assert specs["tool"].sandbox == Confinement(
        workspace="read", read_paths=("/opt/models",), write_paths=("/srv/cache",), required=True
    )
    pinned = json.loads(canonical_launch(specs["tool"]))["sandbox"]
    assert pinned == {
        "workspace": "read",
        "read_paths": ["/opt/models"],
        "write_paths": ["/srv/cache"],
        "required": True,
    }
    widened = {**declared, "workspace": "read-write"}
    again, _ = _user(tmp_path, tool={**ENTRY, "sidecarSandbox": widened})
    assert canonical_launch(again["tool"]) != canonical_launch(specs["tool"])  # more access needs trust again


def test_required_alone_is_the_defaults_and_no_start_without_a_sandbox(tmp_path: Path) -> None:
    specs, problems = _user(tmp_path, strict={**ENTRY, "sidecarSandbox": "required"})
    assert problems == [] and specs["strict"].sandbox == Confinement(required=True)
    assert _package(tmp_path, sandbox="required").sandbox == Confinement(required=True)
    _, refused = _user(tmp_path, loose={**ENTRY, "sidecarSandbox": "optional"})
    assert len(refused) == 1 and "sidecarSandbox" in refused[0]


def test_only_your_own_mcp_json_may_opt_an_entry_out(tmp_path: Path) -> None:
    specs, problems = _user(tmp_path, free={**ENTRY, "sidecarSandbox": False})
    assert problems == [] and specs["free"].sandbox == Confinement(enabled=False)
    assert json.loads(canonical_launch(specs["free"]))["sandbox"] == {"enabled": False}
    plugin = tmp_path / "studio"
    write_config(plugin / ".mcp.json", {"mcpServers": {"render": {**ENTRY, "sidecarSandbox": False}}})
    specs_of_plugin, plugin_problems = load_plugin(plugin)
    assert specs_of_plugin == []
    assert "only your own mcp.json may run a server unsandboxed" in plugin_problems[0].message


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        (True, "sidecarSandbox"),  # true is not a declaration
        ({"workspace": "all"}, "workspace"),
        ({"readPaths": ["relative/path"]}, "must be an absolute path"),
        ({"writePaths": ["/srv/../etc"]}, "must be a normalised path"),
        ({"readPaths": ["/srv/${SIDECAR_PROJECT_DIR}"]}, "without placeholders"),
        ({"network": False}, "network"),  # the network is declared beside it (sidecarNetwork)
    ],
)
def test_a_bad_declaration_is_refused_naming_the_field(tmp_path: Path, declared: Any, why: str) -> None:
    specs, problems = _user(tmp_path, bad={**ENTRY, "sidecarSandbox": declared}, good=ENTRY)
    assert set(specs) == {"good"}  # one broken entry hides no other
    assert len(problems) == 1 and "bad" in problems[0] and why in problems[0], problems


def test_a_remote_server_has_no_process_to_sandbox(tmp_path: Path) -> None:
    remote = {"type": "http", "url": "https://mcp.example.com/mcp", "sidecarSandbox": {"workspace": "read"}}
    _, problems = _user(tmp_path, remote=remote)
    assert "no process of sidecar's to sandbox" in problems[0]


def test_a_shared_process_cannot_see_one_sessions_workspace(tmp_path: Path) -> None:
    shared = {**ENTRY, "process": "shared", "sidecarSandbox": {"workspace": "read"}}
    _, problems = _user(tmp_path, shared=shared)
    assert "cannot show one session's workspace" in problems[0]
    with pytest.raises(ConfigError, match="cannot show one session's workspace"):
        _package(tmp_path, process="shared", sandbox={"workspace": "read"})


def test_a_package_declares_in_connector_json_and_cannot_opt_out(tmp_path: Path) -> None:
    spec = _package(tmp_path, sandbox={"workspace": "read-write"})
    assert spec.sandbox == Confinement(workspace="read-write")
    assert spec.session_free is False  # its sandbox shows a session's workspace: no spare or shared process
    with pytest.raises(ConfigError, match="sandbox"):
        _package(tmp_path, sandbox=False)


def test_the_shipped_workspace_connector_declares_readwrite_config() -> None:
    spec = load_package(Path(__file__).resolve().parents[2] / "connectors" / "workspace")
    assert spec.sandbox == Confinement(workspace="read-write") and spec.network is False
