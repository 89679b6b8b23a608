"""``sidecar.cli.formats.render``: one ``POST /control/sessions`` answer → each agent host's MCP config."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from sidecar.cli.formats import FORMATS, render, server_name

URL = "http://127.0.0.1:43210/mcp"
TOKEN = "Bearer tOkEn-0123456789_abcdefghijklmnopqrstuvwxyzABCDE"
ENVELOPE = "v1.kid0.eyJzZXNzaW9uX2lkIjoic19hYmMifQ.bWFjLW1hYy1tYWM"
HEADERS = {"Authorization": TOKEN, "X-Sidecar-Context": ENVELOPE}


@pytest.fixture
def created() -> dict[str, Any]:
    """What the control API answers to ``POST /control/sessions`` (extra keys included)."""
    return {
        "session_id": "s_abc",
        "url": URL,
        "headers": dict(HEADERS),
        "expires_at": 1_900_000_000,
        "session": {"session_id": "s_abc", "project_id": "p1", "mode": "read-only", "allow": ["calculate"]},
    }


def test_formats_are_the_documented_ones() -> None:
    assert FORMATS == ("raw", "claude-code", "cursor", "vscode", "claude-desktop")


def test_raw_is_exactly_the_documented_keys(created: dict[str, Any]) -> None:
    assert render("raw", created) == {
        "session_id": "s_abc",
        "url": URL,
        "headers": HEADERS,
        "expires_at": 1_900_000_000,
    }


def test_claude_code(created: dict[str, Any]) -> None:
    assert render("claude-code", created) == {
        "mcpServers": {"sidecar": {"type": "http", "url": URL, "headers": HEADERS}}
    }


def test_cursor(created: dict[str, Any]) -> None:
    assert render("cursor", created) == {"mcpServers": {"sidecar": {"url": URL, "headers": HEADERS}}}


def test_vscode(created: dict[str, Any]) -> None:
    assert render("vscode", created) == {"servers": {"sidecar": {"type": "http", "url": URL, "headers": HEADERS}}}


def test_claude_desktop_goes_through_mcp_remote_with_secrets_in_env(created: dict[str, Any]) -> None:
    config = render("claude-desktop", created)
    assert list(config) == ["mcpServers"] and list(config["mcpServers"]) == ["sidecar"]
    entry = config["mcpServers"]["sidecar"]
    assert set(entry) == {"command", "args", "env"}
    assert entry["command"] == "npx"
    args, env = entry["args"], entry["env"]
    assert all(isinstance(a, str) for a in args)
    assert "mcp-remote" in args and URL in args
    assert args.index("mcp-remote") < args.index(URL)  # the URL is mcp-remote's argument

    # Each --header value has no spaces (mcp-remote splits on them) and names an env var that holds the secret.
    header_args = [args[i + 1] for i, a in enumerate(args) if a == "--header"]
    assert len(header_args) == 2
    resolved: dict[str, str] = {}
    for value in header_args:
        assert " " not in value
        name, _, ref = value.partition(":")
        match = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", ref)
        assert match is not None, value
        resolved[name] = env[match.group(1)]
    assert resolved == HEADERS  # after env expansion, exactly the session's headers
    assert set(env.values()) == {TOKEN, ENVELOPE}

    # The secrets are only in env, never on the command line (visible in ps).
    for arg in args:
        assert TOKEN.removeprefix("Bearer ") not in arg and ENVELOPE not in arg


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_json_and_leaves_its_input_alone(fmt: str, created: dict[str, Any]) -> None:
    before = copy.deepcopy(created)
    config = render(fmt, created)
    assert json.loads(json.dumps(config)) == config
    assert created == before
    assert "session" not in json.dumps(config).replace('"session_id"', "")  # the record is not leaked


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in ("raw", "claude-desktop")])
def test_http_formats_copy_the_headers(fmt: str, created: dict[str, Any]) -> None:
    config = render(fmt, created)
    entry = next(iter(next(iter(config.values())).values()))
    entry["headers"]["Authorization"] = "changed"
    assert created["headers"]["Authorization"] == TOKEN


@pytest.mark.parametrize("fmt", ["", "RAW", "claude", "windsurf", "claude_code", "raw "])
def test_unknown_format_is_a_value_error_listing_the_choices(fmt: str, created: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown format") as info:
        render(fmt, created)
    message = str(info.value)
    assert repr(fmt) in message
    for known in FORMATS:
        assert known in message


@pytest.mark.parametrize(
    ("url", "name"),
    [
        (URL, "sidecar"),
        ("http://127.0.0.1:43210/mcp/connectors/workspace", "sidecar-workspace"),
        ("http://127.0.0.1:43210/mcp/connectors/my-db_2", "sidecar-my-db_2"),
        ("http://127.0.0.1:43210/mcp/connectors/", "sidecar"),
        ("http://127.0.0.1:43210/mcp/connectors/a/b", "sidecar"),  # not a connector id: never a path in a name
        ("http://127.0.0.1:43210/api/v1/mcp/connectors/x", "sidecar"),
    ],
)
def test_a_connectors_route_names_its_entry_after_the_connector(url: str, name: str) -> None:
    assert server_name(url) == name


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "raw"])
def test_every_host_format_names_a_connectors_entry_after_it(fmt: str, created: dict[str, Any]) -> None:
    bus = render(fmt, created)
    own = render(fmt, {**created, "url": "http://127.0.0.1:43210/mcp/connectors/workspace"})
    [key] = bus
    assert list(own) == [key]
    assert list(bus[key]) == ["sidecar"] and list(own[key]) == ["sidecar-workspace"]
    assert {**bus[key], **own[key]}.keys() == {"sidecar", "sidecar-workspace"}  # merged, neither replaced


def test_env_refs_name_sidecar_execs_variables_and_hold_no_secret() -> None:
    from sidecar.cli.formats import render_env_refs

    bus = render_env_refs("claude-code")["mcpServers"]["sidecar"]
    assert bus == {
        "type": "http",
        "url": "${SIDECAR_LOCAL_MCP_ORIGIN}/mcp",
        "headers": {
            "Authorization": "${SIDECAR_LOCAL_MCP_AUTHORIZATION}",
            "X-Sidecar-Context": "${SIDECAR_MCP_CONTEXT}",
        },
    }
    own = render_env_refs("claude-code", connector="echo")["mcpServers"]
    assert list(own) == ["sidecar-echo"] and own["sidecar-echo"]["url"].endswith("/mcp/connectors/echo")
    with pytest.raises(ValueError, match="claude-code"):
        render_env_refs("cursor")
