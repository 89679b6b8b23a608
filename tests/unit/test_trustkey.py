"""Trust keys: any change to what would run changes the key; a rotated secret value does not."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from sidecar.connectors.manifest import trustkey
from sidecar.connectors.manifest.sources import (
    ConnectorSpec,
    LaunchConfig,
    load_package,
    load_plugin,
    load_user_servers,
)
from sidecar.connectors.manifest.trustkey import canonical_launch, package_digest, trust_key
from sidecar.errors import ConfigError
from tests.helpers import write_config

CONNECTOR: dict[str, Any] = {"id": "workspace", "name": "Workspace", "type": "mcp", "tools": {"r": {"risk": "LOW"}}}
LAUNCH: dict[str, Any] = {
    "mcpServers": {
        "workspace": {
            "command": "python3",
            "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py"],
            "env": {"API_TOKEN": "secret-one", "LOG_LEVEL": "info"},
        }
    }
}


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "connectors" / "workspace"
    write_config(root / "connector.json", CONNECTOR)
    write_config(root / "mcp.json", LAUNCH)
    write_config(root / "server.py", "print('serving')\n")
    write_config(root / "lib" / "helpers.py", "X = 1\n")
    return root


def _with_launch(spec: ConnectorSpec, **changes: Any) -> ConnectorSpec:
    return dataclasses.replace(spec, launch=dataclasses.replace(spec.launch, **changes))


def _env(spec: ConnectorSpec, **env: str) -> MappingProxyType[str, str]:
    return MappingProxyType({**spec.launch.env, **env})


def _http_spec() -> ConnectorSpec:
    launch = LaunchConfig(
        "http", None, (), MappingProxyType({}), None, "https://mcp.example.com/mcp", MappingProxyType({"X-Key": "v1"})
    )
    return ConnectorSpec(
        id="remote",
        kind="user",
        name="remote",
        description="",
        version=None,
        examples=(),
        launch=launch,
        root=None,
        origin=Path("/nowhere/mcp.json"),
        tool_risks=MappingProxyType({}),
        oauth=None,
        billing_manifest=None,
    )


# --------------------------------------------------------------------------------------------- canonical launch


def test_the_canonical_launch_is_sorted_compact_json_with_env_digests_but_no_values(package: Path) -> None:
    spec = load_package(package)
    raw = canonical_launch(spec)
    token = hashlib.sha256(b"sidecar env value\0API_TOKEN\0secret-one").hexdigest()
    level = hashlib.sha256(b"sidecar env value\0LOG_LEVEL\0info").hexdigest()
    assert raw == (
        b'{"args":["${SIDECAR_CONNECTOR_ROOT}/server.py"],"command":"python3","cwd":null,'
        b'"env_digests":{"API_TOKEN":"' + token.encode() + b'","LOG_LEVEL":"' + level.encode() + b'"},'
        b'"env_keys":["API_TOKEN","LOG_LEVEL"],"header_keys":[],"transport":"stdio","url":null}'
    )
    assert b"secret-one" not in raw


def test_a_connector_without_env_keeps_the_key_it_had_before_env_values_counted() -> None:
    raw = canonical_launch(_http_spec())
    assert b"env_digests" not in raw


def test_header_values_are_left_out() -> None:
    raw = canonical_launch(_http_spec())
    assert b'"header_keys":["X-Key"]' in raw
    assert b"v1" not in raw


# --------------------------------------------------------------------------------------------- what changes the key

LAUNCH_EDITS: list[tuple[str, Callable[[ConnectorSpec], ConnectorSpec]]] = [
    ("command", lambda s: _with_launch(s, command="/usr/bin/python3")),
    ("args: a value", lambda s: _with_launch(s, args=("${SIDECAR_CONNECTOR_ROOT}/other.py",))),
    ("args: one more", lambda s: _with_launch(s, args=(*s.launch.args, "--verbose"))),
    ("args: one prepended", lambda s: _with_launch(s, args=("-X", *s.launch.args))),
    ("env: a key added", lambda s: _with_launch(s, env=_env(s, NODE_OPTIONS="--require x"))),
    ("env: a key removed", lambda s: _with_launch(s, env=MappingProxyType({"API_TOKEN": "secret-one"}))),
    ("env: a value", lambda s: _with_launch(s, env=_env(s, LOG_LEVEL="debug"))),
    (
        "env: a key renamed",
        lambda s: _with_launch(s, env=MappingProxyType({"API_TOKEN": "secret-one", "LOGLEVEL": "info"})),
    ),
    ("cwd", lambda s: _with_launch(s, cwd="/tmp")),
    ("transport", lambda s: _with_launch(s, transport="http", command=None, args=(), url="https://x.example")),
]


@pytest.mark.parametrize("edit", [e for _, e in LAUNCH_EDITS], ids=[n for n, _ in LAUNCH_EDITS])
def test_editing_the_launch_config_changes_the_key(
    package: Path, edit: Callable[[ConnectorSpec], ConnectorSpec]
) -> None:
    spec = load_package(package)
    assert trust_key(edit(spec)) != trust_key(spec)


def test_reordering_args_changes_the_key(package: Path) -> None:
    spec = _with_launch(load_package(package), args=("a", "b"))
    assert trust_key(_with_launch(spec, args=("b", "a"))) != trust_key(spec)


def test_editing_the_url_or_a_header_name_changes_the_key() -> None:
    spec = _http_spec()
    assert trust_key(_with_launch(spec, url="https://mcp.example.com/other")) != trust_key(spec)
    assert trust_key(_with_launch(spec, url="https://evil.example/mcp")) != trust_key(spec)
    assert trust_key(_with_launch(spec, headers=MappingProxyType({"X-Other": "v1"}))) != trust_key(spec)


def test_the_pre_registered_oauth_client_is_part_of_the_key_but_a_server_without_one_hashes_as_before(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mcp.json"
    remote: dict[str, Any] = {"type": "http", "url": "https://mcp.example.com/mcp"}
    variants: list[dict[str, Any] | None] = [
        None,
        {"clientId": "one"},
        {"clientId": "two"},
        {"clientId": "one", "scopes": ["repo"]},
        {"clientId": "one", "clientSecretFile": "/home/u/secret"},
        {"clientMetadataUrl": "https://one.example/client.json"},
        {"clientId": "https://one.example/client.json"},  # the same URL as a registered client is another config
    ]
    keys = []
    for oauth in variants:
        write_config(path, {"mcpServers": {"r": {**remote, **({"oauth": oauth} if oauth else {})}}})
        (spec,), problems = load_user_servers(path)
        assert problems == []
        keys.append(trust_key(spec))
    assert len(set(keys)) == len(variants)
    assert b"oauth" not in canonical_launch(_http_spec())


def test_changing_an_env_value_changes_the_key_and_a_header_value_does_not(package: Path) -> None:
    spec = load_package(package)
    rotated = _with_launch(spec, env=_env(spec, API_TOKEN="secret-two"))
    assert trust_key(rotated) != trust_key(spec)
    http = _http_spec()
    assert trust_key(_with_launch(http, headers=MappingProxyType({"X-Key": "v2"}))) == trust_key(http)


def test_an_ld_preload_swapped_in_the_file_is_another_config(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    keys = []
    for library in ("/tmp/other.so", "/tmp/third.so"):
        write_config(path, {"mcpServers": {"s": {"command": "x", "env": {"LD_PRELOAD": library}}}})
        (spec,), _ = load_user_servers(path)
        keys.append(trust_key(spec))
        assert library.encode() not in canonical_launch(spec)  # hashed, never kept in clear
    assert keys[0] != keys[1]


def test_an_env_placeholder_counts_as_written_not_as_it_expands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mcp.json"
    write_config(path, {"mcpServers": {"s": {"command": "x", "env": {"URL": "${SIDECAR_LOCAL_MCP_ORIGIN}"}}}})
    (spec,), _ = load_user_servers(path)
    before = trust_key(spec)
    monkeypatch.setenv("SIDECAR_LOCAL_MCP_ORIGIN", "http://127.0.0.1:1")
    (again,), _ = load_user_servers(path)
    assert trust_key(again) == before


def test_the_id_is_part_of_the_key(package: Path) -> None:
    spec = load_package(package)
    other = dataclasses.replace(spec, id="workspace2")
    assert trust_key(spec).startswith("workspace::")
    assert trust_key(other).startswith("workspace2::")
    assert trust_key(other).split("::")[1] == trust_key(spec).split("::")[1]  # same content, told apart by the id
    assert trust_key(other) != trust_key(spec)


def test_key_order_and_whitespace_in_mcp_json_do_not_matter(tmp_path: Path) -> None:
    a = write_config(
        tmp_path / "a.json", '{"mcpServers":{"s":{"command":"x","args":["1","2"],"env":{"A":"1","B":"2"}}}}'
    )
    b = write_config(
        tmp_path / "b.json",
        '{\n "mcpServers": {\n  "s": {"env": {"B": "2", "A": "1"}, "args": ["1", "2"], "command": "x"}\n }\n}\n',
    )
    (spec_a,), _ = load_user_servers(a)
    (spec_b,), _ = load_user_servers(b)
    assert trust_key(dataclasses.replace(spec_a, origin=spec_b.origin)) == trust_key(spec_b)
    assert trust_key(spec_a) == trust_key(spec_b)  # where the file lives is not part of the key


def test_a_user_server_key_covers_the_launch_config_alone(tmp_path: Path) -> None:
    path = write_config(tmp_path / "mcp.json", {"mcpServers": {"s": {"command": "x"}}})
    (spec,), _ = load_user_servers(path)
    assert trust_key(spec) == "s::" + hashlib.sha256(canonical_launch(spec)).hexdigest()


# --------------------------------------------------------------------------------------------- package content

PACKAGE_EDITS: list[tuple[str, Callable[[Path], object]]] = [
    ("file content", lambda r: write_config(r / "server.py", "print('pwned')\n")),
    ("one byte in a nested file", lambda r: write_config(r / "lib" / "helpers.py", "X = 2\n")),
    ("a new file", lambda r: write_config(r / "lib" / "extra.py", "")),
    ("a new hidden file", lambda r: write_config(r / ".env", "A=1\n")),
    ("a deleted file", lambda r: os.unlink(r / "lib" / "helpers.py")),
    ("a renamed file", lambda r: os.rename(r / "lib" / "helpers.py", r / "lib" / "helper.py")),
    ("a file moved between directories", lambda r: os.rename(r / "lib" / "helpers.py", r / "helpers.py")),
    ("chmod +x", lambda r: os.chmod(r / "server.py", 0o700)),
    ("a new symlink", lambda r: os.symlink("/usr/bin/python3", r / "python")),
    (
        "a tool risk in connector.json",
        lambda r: write_config(r / "connector.json", {**CONNECTOR, "tools": {"r": {"risk": "HIGH"}}}),
    ),
]


@pytest.mark.parametrize("edit", [e for _, e in PACKAGE_EDITS], ids=[n for n, _ in PACKAGE_EDITS])
def test_editing_any_package_file_changes_the_key(package: Path, edit: Callable[[Path], object]) -> None:
    before = trust_key(load_package(package))
    edit(package)
    assert trust_key(load_package(package)) != before


def test_retargeting_a_symlink_changes_the_digest_and_it_is_never_followed(package: Path, tmp_path: Path) -> None:
    outside = write_config(tmp_path / "outside.py", "A = 1\n")
    os.symlink(outside, package / "linked.py")
    before = package_digest(package)
    write_config(outside, "A = 2\n")  # the link text is hashed, not what it points to
    assert package_digest(package) == before
    os.unlink(package / "linked.py")
    os.symlink(tmp_path / "elsewhere.py", package / "linked.py")
    assert package_digest(package) != before


def test_caches_vcs_and_node_modules_do_not_count(package: Path) -> None:
    before = package_digest(package)
    write_config(package / "__pycache__" / "server.cpython-311.pyc", "cache")
    write_config(package / "lib" / "helpers.cpython-311.pyc", "cache")
    write_config(package / ".git" / "HEAD", "ref: refs/heads/main\n")
    write_config(package / "node_modules" / "left-pad" / "index.js", "module.exports = 1\n")
    (package / "empty-dir").mkdir()
    assert package_digest(package) == before


def test_a_plugin_key_covers_its_directory(tmp_path: Path) -> None:
    plugin = tmp_path / "plugins" / "notes"
    write_config(plugin / ".mcp.json", {"mcpServers": {"store": {"command": "${SIDECAR_CONNECTOR_ROOT}/store"}}})
    write_config(plugin / "store", "#!/bin/sh\n", mode=0o700)
    (spec,), _ = load_plugin(plugin)
    before = trust_key(spec)
    write_config(plugin / "store", "#!/bin/sh\necho changed\n", mode=0o700)
    assert trust_key(spec) != before


def test_the_digest_is_stable_across_runs(package: Path) -> None:
    code = "import sys; from pathlib import Path; from sidecar.connectors.manifest.trustkey import package_digest; "
    code += "print(package_digest(Path(sys.argv[1])))"
    runs = {
        subprocess.run(
            [sys.executable, "-c", code, str(package)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert runs == {package_digest(package)}
    assert len(runs.pop()) == 64


def test_the_same_package_in_another_directory_has_the_same_key(package: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "workspace"
    for path in sorted(package.rglob("*")):
        if path.is_file():
            write_config(copy / path.relative_to(package), path.read_text(), mode=path.stat().st_mode & 0o777)
    assert trust_key(load_package(copy)) == trust_key(load_package(package))


# --------------------------------------------------------------------------------------------- bounds


def test_a_package_with_too_many_files_is_refused(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trustkey, "MAX_PACKAGE_FILES", 5)
    for i in range(3):
        write_config(package / "many" / f"f{i}.txt", "")
    with pytest.raises(ConfigError, match="more than 5 files"):
        package_digest(package)


def test_a_package_too_large_is_refused(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trustkey, "MAX_PACKAGE_BYTES", 4096)
    write_config(package / "blob.bin", "x" * 5000)
    with pytest.raises(ConfigError, match="larger than 4096 bytes"):
        package_digest(package)


def test_the_default_bounds_are_ten_thousand_files_and_200_mib() -> None:
    assert trustkey.MAX_PACKAGE_FILES == 10_000
    assert trustkey.MAX_PACKAGE_BYTES == 200 * 1024 * 1024


def test_a_fifo_in_a_package_is_refused_rather_than_read(package: Path) -> None:
    os.mkfifo(package / "pipe")
    with pytest.raises(ConfigError, match="not a regular file"):
        package_digest(package)


def test_a_user_entrys_tool_risks_are_declared_and_part_of_its_key(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    keys = []
    for risks in (None, {"read": {"risk": "LOW"}}, {"read": {"risk": "MEDIUM"}}):
        entry: dict[str, object] = {"command": "x", **({"tools": risks} if risks else {})}
        write_config(path, {"mcpServers": {"s": entry}})
        (spec,), problems = load_user_servers(path)
        assert problems == []
        keys.append(trust_key(spec))
        assert dict(spec.tool_risks) == {name: tier["risk"] for name, tier in (risks or {}).items()}
    assert len(set(keys)) == 3  # making a tool LOW (it would run unasked) needs trust again


def test_a_user_entrys_billable_tools_are_part_of_its_key(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    keys = []
    for billable in (None, {"approvalKind": "credits", "group": "api"}, {"approvalKind": "credits", "group": "x"}):
        tier: dict[str, object] = {"risk": "MEDIUM", **({"billable": billable} if billable else {})}
        write_config(path, {"mcpServers": {"s": {"command": "x", "tools": {"search": tier}}}})
        (spec,), problems = load_user_servers(path)
        assert problems == []
        keys.append(trust_key(spec))
    assert len(set(keys)) == 3  # dropping a billable declaration (its calls would run unasked) needs trust again


def test_a_package_declares_tool_risks_in_its_connector_file_not_its_mcp_json(package: Path) -> None:
    mcp = package / "mcp.json"
    servers = json.loads(mcp.read_text())
    (entry,) = servers["mcpServers"].values()
    entry["tools"] = {"read": {"risk": "LOW"}}
    mcp.write_text(json.dumps(servers))
    with pytest.raises(ConfigError, match=r"declares its tools' risk in connector\.json"):
        load_package(package)
