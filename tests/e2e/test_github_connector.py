"""The shipped GitHub connector, run as sidecar runs it, against a GitHub stand-in behind a real AS.

The package is copied as it ships; only what points at github.com changes: ``oauth-client.json``'s
endpoints (to the test AS) and ``upstream.base_url`` (to the stand-in), and the id (``ghtest``: the
shipped ``github`` keeps its own). Paths, methods, tools and risks are the shipped ones.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import mcp_client
from tests.e2e.test_internal_api import World, oauth_world, sign_in
from tests.helpers import tool_text
from tests.oauth.github_api import github_app

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "connectors" / "github"


def _package(root: Path, issuer: str, upstream: str) -> str:
    directory = root / "ghtest"
    shutil.copytree(SHIPPED, directory)
    connector = json.loads((directory / "connector.json").read_text())
    launch = json.loads((directory / "mcp.json").read_text())
    oauth = json.loads((directory / "oauth-client.json").read_text())
    connector["id"] = "ghtest"
    env = launch["mcpServers"]["github"]["env"]
    env["GITHUB_API"] = env["GITHUB_API"].replace("/internal/github/", "/internal/ghtest/")
    for key in ("authorization_endpoint", "token_endpoint"):
        del oauth[key]
    oauth.update({"issuer": issuer, "scopes": ["openid", "offline_access"], "authorize_params": {"prompt": "consent"}})
    oauth["upstream"]["base_url"] = upstream
    for name, content in (("connector.json", connector), ("mcp.json", launch), ("oauth-client.json", oauth)):
        (directory / name).write_text(json.dumps(content))
    directory.chmod(0o700)
    for child in directory.iterdir():
        child.chmod(0o600)
    return "ghtest"


@pytest.fixture
async def world(home: Path, workspace: Path, tmp_path: Path) -> AsyncIterator[World]:
    async with oauth_world(workspace, tmp_path, {}, package=_package, upstream_app=github_app) as found:
        yield found


async def _call(session: dict[str, Any], tool: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    async with mcp_client(session) as client:
        result = await client.call_tool(f"mcp__ghtest__{tool}", arguments)
    return bool(result.is_error), tool_text(result)


async def test_reads_and_writes_go_through_the_internal_api_with_the_shipped_paths_and_risks(
    world: World, tmp_path: Path
) -> None:
    await sign_in(world, tmp_path, "ghtest")
    shown = await world.daemon.control("GET", "/control/connectors/ghtest")
    assert shown["auth"] == "ready"
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__ghtest__*"])
    error, text = await _call(session, "search_issues", {"query": "repo:octo/widgets is:open flaky"})
    assert not error and json.loads(text)["items"][0]["title"] == "Flaky test in parser"
    assert world.upstream.seen[-1]["query"] == {"q": "repo:octo/widgets is:open flaky", "per_page": "20"}
    assert world.upstream.seen[-1]["api_version"] == "2022-11-28"
    error, text = await _call(session, "list_issues", {"owner": "octo", "repo": "widgets"})
    assert not error and [i["number"] for i in json.loads(text)] == [1, 2]
    error, text = await _call(session, "get_pull_request", {"owner": "octo", "repo": "widgets", "number": 2})
    assert not error and json.loads(text)["head"] == "fix-parser"
    error, text = await _call(session, "search_code", {"query": "parse repo:octo/widgets"})
    assert not error and json.loads(text)["items"][0]["path"] == "src/parser.py"
    error, text = await _call(session, "create_issue", {"owner": "octo", "repo": "widgets", "title": "Docs"})
    assert not error and json.loads(text)["number"] == 3
    assert world.upstream.seen[-1]["json"] == {"title": "Docs", "body": ""}
    error, text = await _call(session, "list_issues", {"owner": "..", "repo": "widgets"})
    assert error and "owner must be a GitHub name" in text


async def test_writes_are_medium_so_a_read_only_session_cannot_see_them(world: World, tmp_path: Path) -> None:
    await sign_in(world, tmp_path, "ghtest")
    session = await world.daemon.new_session(mode="read-only", allow=["mcp__ghtest__*"])
    async with mcp_client(session) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    reads = {"search_issues", "list_issues", "get_issue", "list_pull_requests", "get_pull_request", "search_code"}
    assert {f"mcp__ghtest__{n}" for n in reads} <= names
    assert not {"mcp__ghtest__create_issue", "mcp__ghtest__comment_on_issue"} & names


async def test_after_revoke_the_connector_says_unauthorized_in_plain_words(world: World, tmp_path: Path) -> None:
    await sign_in(world, tmp_path, "ghtest")
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__ghtest__*"])
    assert not (await _call(session, "get_issue", {"owner": "octo", "repo": "widgets", "number": 1}))[0]
    revoked = await world.daemon.control("POST", "/control/connectors/ghtest/revoke")
    assert revoked["auth"] == "unauthorized"
    sent = len(world.upstream.seen)
    error, text = await _call(session, "get_issue", {"owner": "octo", "repo": "widgets", "number": 1})
    assert error and "unauthorized" in text and "sidecar connectors connect github" in text
    assert len(world.upstream.seen) == sent
