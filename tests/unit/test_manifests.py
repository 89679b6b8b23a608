"""Connector manifests: three sources, one shape; every problem names its file and field, none hides another."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.connectors.manifest.sources import (
    ConnectorSpec,
    ManifestProblem,
    discover,
    load_package,
    load_plugin,
    load_user_servers,
)
from sidecar.errors import ConfigError

CONNECTOR: dict[str, Any] = {
    "id": "workspace",
    "name": "Workspace",
    "description": "Read and write files in the session's workspace.",
    "examples": ["List the files in my project"],
    "version": "0.1.0",
    "type": "mcp",
    "source": "https://example.com/sidecar/connectors/workspace",
    "tools": {"read_file": {"risk": "LOW"}, "write_file": {"risk": "MEDIUM"}, "delete_tree": {"risk": "HIGH"}},
}
PACKAGE_LAUNCH: dict[str, Any] = {
    "mcpServers": {
        "workspace": {
            "command": "python3",
            "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py", "--root", "${SIDECAR_PROJECT_DIR}"],
            "env": {"SIDECAR_API": "${SIDECAR_LOCAL_MCP_ORIGIN}", "LOG_LEVEL": "info"},
            "cwd": "${SIDECAR_CONNECTOR_ROOT}",
        }
    }
}
OAUTH: dict[str, Any] = {
    "metadata_url": "https://auth.example.com/.well-known/oauth-authorization-server",
    "client_id": "sidecar-workspace",
    "scopes": ["files.read", "files.write"],
    "upstream": {"base_url": "https://api.example.com/v1", "paths": ["/files/"], "methods": ["GET", "PUT"]},
}
GOOD_STDIO: dict[str, Any] = {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}}
GOOD_HTTP: dict[str, Any] = {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"X-Team": "a"}}


def _write(path: Path, content: Any, *, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    os.chmod(path, mode)  # the umask must not decide whether a test file is trusted
    return path


def _package(
    base: Path,
    connector: dict[str, Any] | None = None,
    launch: dict[str, Any] | None = None,
    *,
    oauth: dict[str, Any] | None = None,
) -> Path:
    connector = connector or CONNECTOR
    directory: Path = base / str(connector["id"])
    _write(directory / "connector.json", connector)
    _write(directory / "mcp.json", launch or PACKAGE_LAUNCH)
    _write(directory / "server.py", "print('hello')\n")
    if oauth is not None:
        _write(directory / "oauth-client.json", oauth)
    return directory


def _only(problems: list[ManifestProblem]) -> ManifestProblem:
    assert len(problems) == 1, [p.message for p in problems]
    return problems[0]


def _ids(specs: list[ConnectorSpec]) -> list[str]:
    return [spec.id for spec in specs]


# --------------------------------------------------------------------------------------------- valid sources


def test_a_package_loads_its_launch_tool_risks_oauth_client_and_billing_manifest(tmp_path: Path) -> None:
    directory = _package(tmp_path, oauth=OAUTH)
    _write(directory / "high-credit-tools.json", {"version": 1, "tools": {}})

    spec = load_package(directory)

    assert (spec.id, spec.kind, spec.name, spec.version) == ("workspace", "package", "Workspace", "0.1.0")
    assert spec.examples == ("List the files in my project",)
    assert spec.root == directory
    assert spec.origin == directory / "connector.json"
    assert dict(spec.tool_risks) == {"read_file": "LOW", "write_file": "MEDIUM", "delete_tree": "HIGH"}
    assert spec.billing_manifest == directory / "high-credit-tools.json"
    launch = spec.launch
    assert launch.transport == "stdio"
    assert launch.command == "python3"
    assert launch.args == ("${SIDECAR_CONNECTOR_ROOT}/server.py", "--root", "${SIDECAR_PROJECT_DIR}")
    assert dict(launch.env) == {"SIDECAR_API": "${SIDECAR_LOCAL_MCP_ORIGIN}", "LOG_LEVEL": "info"}
    assert launch.cwd == "${SIDECAR_CONNECTOR_ROOT}"
    assert launch.url is None
    assert dict(launch.headers) == {}
    assert spec.oauth is not None
    assert spec.oauth.client_id == "sidecar-workspace"
    assert spec.oauth.scopes == ("files.read", "files.write")
    assert spec.oauth.upstream.base_url == "https://api.example.com/v1"
    assert spec.oauth.upstream.methods == ("GET", "PUT")
    assert spec.oauth.pkce is True
    assert spec.oauth.token_endpoint is None


def test_a_package_without_oauth_or_billing_files_has_neither(tmp_path: Path) -> None:
    spec = load_package(_package(tmp_path))
    assert spec.oauth is None
    assert spec.billing_manifest is None


def test_a_package_may_reach_the_daemon_over_loopback_http_through_placeholders(tmp_path: Path) -> None:
    entry = {
        "type": "streamable-http",
        "url": "${SIDECAR_LOCAL_MCP_ORIGIN}/mcp/internal/workspace/mcp",
        "headers": {
            "Authorization": "${SIDECAR_LOCAL_MCP_AUTHORIZATION}",
            "X-Sidecar-Context": "${SIDECAR_MCP_CONTEXT}",
        },
    }
    spec = load_package(_package(tmp_path, launch={"mcpServers": {"workspace": entry}}))
    assert spec.launch.transport == "http"
    assert spec.launch.url == entry["url"]
    assert dict(spec.launch.headers) == entry["headers"]
    assert spec.launch.command is None
    assert spec.launch.args == ()


def test_an_oauth_client_may_give_its_endpoints_instead_of_a_metadata_url(tmp_path: Path) -> None:
    oauth = {
        "authorization_endpoint": "https://auth.example.com/authorize",
        "token_endpoint": "https://auth.example.com/token",
        "revocation_endpoint": "https://auth.example.com/revoke",
        "client_id": "abc",
        "upstream": {"base_url": "http://127.0.0.1:9000/api", "paths": ["/"], "methods": ["GET"]},
    }
    spec = load_package(_package(tmp_path, oauth=oauth))
    assert spec.oauth is not None
    assert spec.oauth.metadata_url is None
    assert spec.oauth.token_endpoint == "https://auth.example.com/token"
    assert spec.oauth.scopes == ()


def test_user_servers_load_in_the_shapes_hosts_write(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "mcp.json",
        {
            "mcpServers": {
                "time": GOOD_STDIO,
                "explicit-stdio": {"type": "stdio", "command": "/usr/bin/env", "args": [], "cwd": "/tmp"},
                "remote": GOOD_HTTP,
                "streamable": {"type": "streamable-http", "url": "https://a.example/mcp"},
                "cursor-style": {"url": "http://localhost:8931/mcp"},
                "ipv6-local": {"type": "http", "url": "http://[::1]:8931/mcp"},
                "host_keys": {
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-everything"],
                    "autoApprove": ["echo"],
                    "alwaysAllow": [],
                    "timeout": 30,
                    "description": "ignored",
                    "disabled": False,
                },
            }
        },
    )

    specs, problems = load_user_servers(path)

    assert problems == []
    assert _ids(specs) == ["time", "explicit-stdio", "remote", "streamable", "cursor-style", "ipv6-local", "host_keys"]
    by_id = {spec.id: spec for spec in specs}
    assert all(spec.kind == "user" and spec.root is None and spec.origin == path for spec in specs)
    assert by_id["time"].launch.command == "uvx"
    assert dict(by_id["time"].launch.env) == {"TZ": "UTC"}
    assert by_id["remote"].launch.transport == "http"
    assert dict(by_id["remote"].launch.headers) == {"X-Team": "a"}
    assert by_id["cursor-style"].launch.transport == "http"
    assert by_id["explicit-stdio"].launch.cwd == "/tmp"
    assert dict(by_id["time"].tool_risks) == {}


def test_an_http_entry_may_name_a_pre_registered_oauth_client_with_its_secret_in_a_file(tmp_path: Path) -> None:
    oauth = {"clientId": "Iv1.abc", "clientSecretFile": "/home/u/.config/gh-secret", "scopes": ["repo", "read:org"]}
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"github": {**GOOD_HTTP, "oauth": oauth}}})
    (spec,), problems = load_user_servers(path)
    assert problems == []
    client = spec.launch.oauth
    assert client is not None
    assert (client.client_id, client.secret_file, client.scopes) == (
        "Iv1.abc",
        Path("/home/u/.config/gh-secret"),
        ("repo", "read:org"),
    )


@pytest.mark.parametrize(
    ("oauth", "words"),
    [
        ({"clientId": "a", "clientSecret": "s3cr3t-value"}, 'name that file in "clientSecretFile"'),
        ({"clientId": "a", "clientSecretFile": "secret.txt"}, "must be an absolute path"),
        ({"clientId": "a", "clientSecretFile": "${SIDECAR_CONNECTOR_ROOT}/s"}, "must be an absolute path"),
        ({"clientId": "a", "callbackPort": 8080}, "callbackPort"),
        ({"clientId": "a", "scopes": ["two words"]}, "scope token"),
        ({"clientSecretFile": "/s"}, "clientId"),
        ({"clientId": "a", "clientSecretFile": None}, "clientSecretFile"),
        ({"clientId": "a", "clientMetadataUrl": "https://c.example/c.json"}, "exactly one of clientId"),
        ({"clientMetadataUrl": "http://127.0.0.1/c.json"}, "must be an https URL with a path"),
        ({"clientMetadataUrl": "https://c.example/"}, "must be an https URL with a path"),
        ({"clientMetadataUrl": "https://c.example/c.json", "clientSecretFile": "/s"}, "has no secret"),
    ],
)
def test_an_oauth_block_is_validated_strictly_and_an_inline_secret_is_never_repeated(
    tmp_path: Path, oauth: dict[str, Any], words: str
) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"r": {**GOOD_HTTP, "oauth": oauth}}})
    specs, problems = load_user_servers(path)
    assert specs == []
    message = _only(problems).message
    assert words in message, message
    assert "s3cr3t-value" not in message


def test_an_http_entry_may_name_a_client_metadata_document_as_its_client(tmp_path: Path) -> None:
    oauth = {"clientMetadataUrl": "https://sidecar.example/oauth/client.json", "scopes": ["repo"]}
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"github": {**GOOD_HTTP, "oauth": oauth}}})
    (spec,), problems = load_user_servers(path)
    assert problems == []
    client = spec.launch.oauth
    assert client is not None and client.metadata_document
    assert (client.client_id, client.secret_file, client.scopes) == (oauth["clientMetadataUrl"], None, ("repo",))


def test_an_oauth_block_is_refused_on_a_stdio_server(tmp_path: Path) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"s": {**GOOD_STDIO, "oauth": {"clientId": "a"}}}})
    specs, problems = load_user_servers(path)
    assert specs == [] and "oauth" in _only(problems).message


def test_disabled_servers_are_skipped_even_when_broken(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "mcp.json",
        {
            "mcpServers": {
                "off": {**GOOD_STDIO, "disabled": True},
                "off-and-broken": {"type": "sse", "url": "ftp://x", "disabled": True},
                "on": GOOD_STDIO,
            }
        },
    )
    specs, problems = load_user_servers(path)
    assert _ids(specs) == ["on"]
    assert problems == []


def test_a_missing_user_file_means_no_servers_and_no_problem(tmp_path: Path) -> None:
    assert load_user_servers(tmp_path / "absent.json") == ([], [])


def test_a_plugin_contributes_servers_from_both_files_with_prefixed_ids(tmp_path: Path) -> None:
    directory = tmp_path / "plugins" / "notes"
    _write(
        directory / "plugin.json",
        {
            "name": "notes",
            "version": "2.1.0",
            "description": "Notes everywhere",
            "author": {"name": "someone"},
            "mcpServers": {"store": {"command": "${SIDECAR_CONNECTOR_ROOT}/bin/store", "args": []}},
        },
    )
    _write(directory / ".mcp.json", {"mcpServers": {"search": GOOD_HTTP}})

    specs, problems = load_plugin(directory)

    assert problems == []
    assert _ids(specs) == ["notes-store", "notes-search"]
    store, search = specs
    assert (store.kind, store.name, store.version, store.description) == (
        "plugin",
        "store",
        "2.1.0",
        "Notes everywhere",
    )
    assert store.root == directory
    assert store.origin == directory / "plugin.json"
    assert search.origin == directory / ".mcp.json"
    assert search.launch.transport == "http"


def test_a_plugin_directory_without_servers_contributes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "skills-only"
    directory.mkdir()
    assert load_plugin(directory) == ([], [])
    _write(directory / "plugin.json", {"name": "skills-only", "skills": "./skills"})
    assert load_plugin(directory) == ([], [])


def test_discover_reads_every_source_in_order(tmp_path: Path) -> None:
    shipped, installed = tmp_path / "repo" / "connectors", tmp_path / "data" / "connectors"
    _package(shipped)
    _package(installed, {**CONNECTOR, "id": "calendar"})
    (installed / "no-manifest").mkdir()  # a subdirectory without connector.json is not a package
    user = _write(tmp_path / "config" / "mcp.json", {"mcpServers": {"time": GOOD_STDIO}})
    _write(tmp_path / "data" / "plugins" / "notes" / ".mcp.json", {"mcpServers": {"store": GOOD_STDIO}})

    specs, problems = discover(
        package_dirs=[shipped, installed], user_config=user, plugins_dir=tmp_path / "data" / "plugins"
    )

    assert problems == []
    assert _ids(specs) == ["workspace", "calendar", "time", "notes-store"]
    assert [spec.kind for spec in specs] == ["package", "package", "user", "plugin"]


def test_discover_with_no_sources_at_all_is_empty(tmp_path: Path) -> None:
    specs, problems = discover(
        package_dirs=[tmp_path / "none"], user_config=tmp_path / "mcp.json", plugins_dir=tmp_path / "plugins"
    )
    assert (specs, problems) == ([], [])


def test_key_order_and_whitespace_in_a_file_do_not_change_the_spec(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", '{"mcpServers":{"t":{"command":"x","args":["1"],"env":{"A":"1","B":"2"}}}}')
    b = _write(
        tmp_path / "b.json",
        '{\n  "mcpServers": {"t": {"env": {"B": "2", "A": "1"},\n "args": ["1"], "command": "x"}}\n}',
    )
    (spec_a,), _ = load_user_servers(a)
    (spec_b,), _ = load_user_servers(b)
    assert spec_a.launch == spec_b.launch


# --------------------------------------------------------------------------------------------- broken entries

# (server name, entry, the field the problem must name, words it must contain)
BROKEN_ENTRIES: list[tuple[str, Any, str, str]] = [
    ("bad", {"args": ["x"]}, "mcpServers.bad.command", "missing"),
    ("bad", {"command": "", "args": []}, "mcpServers.bad.command", "must not be empty"),
    ("bad", {"command": ["uvx"]}, "mcpServers.bad.command", "must be a string"),
    ("bad", {"command": "npx -y server"}, "mcpServers.bad.command", 'put the arguments in "args"'),
    ("bad", {"command": "uvx", "args": "mcp-server-time"}, "mcpServers.bad.args", "must be a list"),
    ("bad", {"command": "uvx", "args": ["ok", 3]}, "mcpServers.bad.args[1]", "must be a string"),
    ("bad", {"command": "uvx", "env": {"PORT": 8080}}, "mcpServers.bad.env.PORT", "must be a string"),
    (
        "bad",
        {"command": "uvx", "env": {"NOT-A-NAME": "1"}},
        "mcpServers.bad.env.NOT-A-NAME",
        "not a valid variable name",
    ),
    ("bad", {"command": "uvx", "env": ["A=1"]}, "mcpServers.bad.env", "must be an object"),
    ("bad", {"command": "uvx", "argz": ["typo"]}, "mcpServers.bad.argz", "unknown key"),
    ("bad", {"command": "uvx", "url": "https://x.example"}, "mcpServers.bad.url", "not used by a stdio server"),
    ("bad", {"command": "uvx", "disabled": "yes"}, "mcpServers.bad.disabled", "true or false"),
    ("bad", {"command": "uvx", "args": ["${SIDECAR_ROOT}/x"]}, "mcpServers.bad.args[0]", "unknown placeholder"),
    ("bad", {"command": "${SIDECAR_CONNECTOR_ROOT}/x"}, "mcpServers.bad.command", "only for packages and plugins"),
    ("bad", {"command": "uvx", "cwd": 7}, "mcpServers.bad.cwd", "must be a string"),
    ("bad__name", GOOD_STDIO, "mcpServers.bad__name", "no '__'"),
    ("a" * 33, GOOD_STDIO, "mcpServers." + "a" * 33, "the limit is 32"),
    ("Bad", GOOD_STDIO, "mcpServers.Bad", "lowercase"),
    ("bad", {"type": "sse", "url": "https://x.example/sse"}, "mcpServers.bad.type", "SSE transport is not supported"),
    ("bad", {"type": "websocket", "url": "wss://x"}, "mcpServers.bad.type", "unknown transport"),
    ("bad", {"type": "http", "url": "file:///etc/passwd"}, "mcpServers.bad.url", "scheme must be http or https"),
    ("bad", {"type": "http", "url": "http://evil.com/mcp"}, "mcpServers.bad.url", "only to loopback"),
    ("bad", {"type": "http", "url": "http://127.0.0.1.evil.com/mcp"}, "mcpServers.bad.url", "only to loopback"),
    ("bad", {"type": "http", "url": "https://user:pw@x.example/"}, "mcpServers.bad.url", "credentials"),
    ("bad", {"type": "http", "url": "https:///nohost"}, "mcpServers.bad.url", "no host"),
    ("bad", {"type": "http"}, "mcpServers.bad.url", "missing"),
    ("bad", {"type": "http", "url": "https://x.example", "command": "uvx"}, "mcpServers.bad.command", "not used"),
    ("bad", {**GOOD_HTTP, "headers": {"X-A": "1\r\nX-B: 2"}}, "mcpServers.bad.headers.X-A", "line break"),
    (
        "bad",
        {**GOOD_HTTP, "headers": {"Bad Header": "1"}},
        "mcpServers.bad.headers['Bad Header']",
        "not a valid header name",
    ),
    ("bad", "uvx mcp-server-time", "mcpServers.bad", "must be an object"),
]


@pytest.mark.parametrize(
    ("name", "entry", "field", "words"), BROKEN_ENTRIES, ids=[f"{c[2]}:{c[3]}"[:60] for c in BROKEN_ENTRIES]
)
def test_a_broken_user_entry_is_one_problem_naming_file_and_field_and_hides_no_other(
    tmp_path: Path, name: str, entry: Any, field: str, words: str
) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"before": GOOD_STDIO, name: entry, "after": GOOD_HTTP}})

    specs, problems = load_user_servers(path)

    problem = _only(problems)
    assert problem.path == path
    assert problem.message.startswith(f"{path}: {field}: ")
    assert words in problem.message
    assert _ids(specs) == ["before", "after"]


def test_one_entry_with_several_faults_is_still_one_problem_listing_them_all(tmp_path: Path) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"bad": {"args": "x", "env": {"A": 1}, "typo": 1}}})
    specs, problems = load_user_servers(path)
    message = _only(problems).message
    for field in ("mcpServers.bad.command", "mcpServers.bad.args", "mcpServers.bad.env.A", "mcpServers.bad.typo"):
        assert field in message
    assert specs == []


def test_an_unknown_top_level_key_is_a_problem_but_the_servers_still_load(tmp_path: Path) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServer": {"lost": GOOD_STDIO}, "mcpServers": {"time": GOOD_STDIO}})
    specs, problems = load_user_servers(path)
    assert _only(problems).message == f"{path}: mcpServer: unknown key (a typo?)"
    assert _ids(specs) == ["time"]


def test_a_file_that_is_not_strict_json_is_one_problem(tmp_path: Path) -> None:
    for text, words in [
        ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "duplicate key 'a'"),
        ('{"mcpServers": {"a": {"command": "x", "timeout": NaN}}}', "NaN is not JSON"),
        ('{"mcpServers": {"a": {"command": "x", "timeout": 1e400}}}', "1e400 is too large a number"),
        ("[" * 5000, "not valid JSON"),
        ('{"mcpServers": []}', "mcpServers: must be an object"),
        ("[]", "the top level must be an object"),
    ]:
        path = _write(tmp_path / "mcp.json", text)
        specs, problems = load_user_servers(path)
        assert specs == []
        message = _only(problems).message
        assert message.startswith(f"{path}: ")
        assert words in message, message


# ----------------------------------------------------------------------------------------- broken files, all sources

Breaker = Callable[[Path], object]


def _tree(root: Path) -> dict[str, Path]:
    """A healthy tree of every source: packages alpha + beta, user servers, a plugin with two files."""
    packages = root / "data" / "connectors"
    _package(packages, {**CONNECTOR, "id": "alpha"})
    _package(packages, {**CONNECTOR, "id": "beta"})
    user = _write(root / "config" / "mcp.json", {"mcpServers": {"time": GOOD_STDIO, "remote": GOOD_HTTP}})
    plugin = root / "data" / "plugins" / "notes"
    _write(plugin / "plugin.json", {"name": "notes", "version": "1", "mcpServers": {"store": GOOD_STDIO}})
    _write(plugin / ".mcp.json", {"mcpServers": {"search": GOOD_HTTP}})
    return {"packages": packages, "beta": packages / "beta", "user": user, "plugin": plugin}


def _symlink_connector(beta: Path) -> None:
    real = beta.parent.parent / "elsewhere.json"
    (beta / "connector.json").rename(real)
    (beta / "connector.json").symlink_to(real)


# (what breaks, the file the problem names, the field (or "" for a whole-file problem), words, ids that go)
BROKEN_FILES: list[tuple[str, Breaker, str, str, str, set[str]]] = [
    (
        "bad JSON in the user's mcp.json",
        lambda r: _write(r / "config" / "mcp.json", '{"mcpServers": {'),
        "config/mcp.json",
        "",
        "not valid JSON",
        {"time", "remote"},
    ),
    (
        "world-writable user mcp.json",
        lambda r: os.chmod(r / "config" / "mcp.json", 0o666),
        "config/mcp.json",
        "",
        "may be written by other users",
        {"time", "remote"},
    ),
    (
        "symlinked connector.json",
        lambda r: _symlink_connector(r / "data" / "connectors" / "beta"),
        "data/connectors/beta/connector.json",
        "",
        "symbolic link",
        {"beta"},
    ),
    (
        "oauth-client.json with a client secret",
        lambda r: _write(r / "data/connectors/beta/oauth-client.json", {**OAUTH, "client_secret": "s3cr3t"}),
        "data/connectors/beta/oauth-client.json",
        "client_secret",
        "public client",
        {"beta"},
    ),
    (
        "oauth-client.json over plain http to a remote host",
        lambda r: _write(
            r / "data/connectors/beta/oauth-client.json",
            {**OAUTH, "upstream": {**OAUTH["upstream"], "base_url": "http://api.example"}},
        ),
        "data/connectors/beta/oauth-client.json",
        "upstream.base_url",
        "only to loopback",
        {"beta"},
    ),
    (
        "oauth-client.json with neither metadata nor endpoints",
        lambda r: _write(
            r / "data/connectors/beta/oauth-client.json",
            {"client_id": "x", "upstream": OAUTH["upstream"], "token_endpoint": "https://a.example/t"},
        ),
        "data/connectors/beta/oauth-client.json",
        "authorization_endpoint",
        "missing",
        {"beta"},
    ),
    (
        "a package mcp.json with two servers",
        lambda r: _write(r / "data/connectors/beta/mcp.json", {"mcpServers": {"one": GOOD_STDIO, "two": GOOD_STDIO}}),
        "data/connectors/beta/mcp.json",
        "mcpServers",
        "exactly one server; found 2",
        {"beta"},
    ),
    (
        "a package mcp.json with a bad entry",
        lambda r: _write(r / "data/connectors/beta/mcp.json", {"mcpServers": {"beta": {"command": "x", "env": 1}}}),
        "data/connectors/beta/mcp.json",
        "mcpServers.beta.env",
        "must be an object",
        {"beta"},
    ),
    (
        "a package without mcp.json",
        lambda r: os.unlink(r / "data/connectors/beta/mcp.json"),
        "data/connectors/beta/mcp.json",
        "",
        "missing",
        {"beta"},
    ),
    (
        "a package id that is not its directory",
        lambda r: _write(r / "data/connectors/beta/connector.json", {**CONNECTOR, "id": "gamma"}),
        "data/connectors/beta/connector.json",
        "id",
        "does not match the package directory",
        {"beta"},
    ),
    (
        "a package id with a double underscore",
        lambda r: _write(r / "data/connectors/beta/connector.json", {**CONNECTOR, "id": "be__ta"}),
        "data/connectors/beta/connector.json",
        "id",
        "no '__'",
        {"beta"},
    ),
    (
        "a package tool risk that is not a tier",
        lambda r: _write(
            r / "data/connectors/beta/connector.json", {**CONNECTOR, "id": "beta", "tools": {"x": {"risk": "low"}}}
        ),
        "data/connectors/beta/connector.json",
        "tools.x.risk",
        "must be 'LOW', 'MEDIUM' or 'HIGH', got 'low'",
        {"beta"},
    ),
    (
        "a connector.json with an unknown key",
        lambda r: _write(r / "data/connectors/beta/connector.json", {**CONNECTOR, "id": "beta", "tool": {}}),
        "data/connectors/beta/connector.json",
        "tool",
        "unknown key",
        {"beta"},
    ),
    (
        "a plugin.json that claims another plugin's name",
        lambda r: _write(r / "data/plugins/notes/plugin.json", {"name": "other", "mcpServers": {}}),
        "data/plugins/notes/plugin.json",
        "name",
        "does not match the plugin directory",
        {"notes-store", "notes-search"},
    ),
    (
        "a plugin server given by both of its files",
        lambda r: _write(r / "data/plugins/notes/.mcp.json", {"mcpServers": {"store": GOOD_HTTP}}),
        "data/plugins/notes/.mcp.json",
        "mcpServers.store",
        "already defined by",
        {"notes-search"},
    ),
    (
        "a plugin server whose id is too long",
        lambda r: _write(r / "data/plugins/notes/.mcp.json", {"mcpServers": {"s" * 30: GOOD_HTTP}}),
        "data/plugins/notes/.mcp.json",
        "mcpServers." + "s" * 30,
        "the limit is 32",
        {"notes-search"},
    ),
]


@pytest.mark.parametrize(
    ("breaker", "file", "field", "words", "gone"), [c[1:] for c in BROKEN_FILES], ids=[c[0] for c in BROKEN_FILES]
)
def test_a_broken_file_is_one_problem_naming_it_and_every_other_source_still_loads(
    tmp_path: Path, breaker: Breaker, file: str, field: str, words: str, gone: set[str]
) -> None:
    tree = _tree(tmp_path)
    healthy, no_problems = discover(
        package_dirs=[tree["packages"]], user_config=tree["user"], plugins_dir=tmp_path / "data" / "plugins"
    )
    assert no_problems == []
    breaker(tmp_path)

    specs, problems = discover(
        package_dirs=[tree["packages"]], user_config=tree["user"], plugins_dir=tmp_path / "data" / "plugins"
    )

    problem = _only(problems)
    assert problem.path == tmp_path / file
    prefix = f"{tmp_path / file}: {field}: " if field else f"{tmp_path / file}: "
    assert problem.message.startswith(prefix), problem.message
    assert words in problem.message
    assert set(_ids(specs)) == set(_ids(healthy)) - gone


def test_load_package_raises_a_config_error_naming_file_and_field(tmp_path: Path) -> None:
    directory = _package(tmp_path, oauth={**OAUTH, "client_secret": "s3cr3t"})
    with pytest.raises(ConfigError) as caught:
        load_package(directory)
    assert str(caught.value).startswith(f"{directory / 'oauth-client.json'}: client_secret: ")
    assert "s3cr3t" not in str(caught.value)  # the offending key is named, its secret value never repeated


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_file_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "mcp.json", {"mcpServers": {"time": GOOD_STDIO}})
    os.chown(path, 65534, 65534)
    specs, problems = load_user_servers(path)
    assert specs == []
    assert "belongs to uid 65534" in _only(problems).message


# --------------------------------------------------------------------------------------------- id collisions


def _collision_tree(root: Path) -> dict[str, Any]:
    shipped, installed = root / "repo" / "connectors", root / "data" / "connectors"
    _package(shipped, {**CONNECTOR, "id": "dup"})
    _package(installed, {**CONNECTOR, "id": "dup"})
    user = _write(root / "config" / "mcp.json", {"mcpServers": {"dup": GOOD_STDIO, "notes-store": GOOD_HTTP}})
    _write(root / "data" / "plugins" / "notes" / "plugin.json", {"name": "notes", "mcpServers": {"store": GOOD_STDIO}})
    return {"package_dirs": [shipped, installed], "user_config": user, "plugins_dir": root / "data" / "plugins"}


def test_an_id_collision_keeps_the_first_source_and_refuses_the_rest_naming_both_files(tmp_path: Path) -> None:
    sources = _collision_tree(tmp_path)
    shipped = tmp_path / "repo" / "connectors" / "dup" / "connector.json"
    user = sources["user_config"]

    specs, problems = discover(**sources)

    assert _ids(specs) == ["dup", "notes-store"]
    assert [spec.origin for spec in specs] == [shipped, user]
    messages = [p.message for p in problems]
    assert messages == [
        f"{tmp_path}/data/connectors/dup/connector.json: id: id 'dup' is already taken by {shipped}; refused "
        "(ids are never renamed: rename one of them)",
        f"{user}: mcpServers.dup: id 'dup' is already taken by {shipped}; refused "
        "(ids are never renamed: rename one of them)",
        f"{tmp_path}/data/plugins/notes/plugin.json: mcpServers.store: id 'notes-store' is already taken by {user}; "
        "refused (ids are never renamed: rename one of them)",
    ]


def test_collisions_are_settled_the_same_way_every_time_and_never_by_renaming(tmp_path: Path) -> None:
    sources = _collision_tree(tmp_path)
    first = discover(**sources)
    for _ in range(3):
        assert discover(**sources) == first
    assert all(spec.id in {"dup", "notes-store"} for spec in first[0])
