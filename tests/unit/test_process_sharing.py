"""Which connectors one process may serve for every session: ``"process": "shared"`` and the rule behind it.

Issue 15 items 3 and 4 at the manifest seam: ``spec.session_dependence`` (a launch config with a per-session
placeholder, or without a cwd of its own, differs per session), the refusal of ``"process": "shared"`` on
such a config in the user's ``mcp.json`` and in a package's ``connector.json``, and the trust key that pins
the declaration. Also ``SessionView``: one session's calls through a shared client, aborted alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from sidecar.connectors.manifest.sources import ConnectorSpec, load_package, load_user_servers
from sidecar.connectors.manifest.spec import SESSION_PLACEHOLDERS, session_dependence
from sidecar.connectors.manifest.trustkey import canonical_launch, trust_key
from sidecar.connectors.sharing.shared import SessionView
from sidecar.errors import ConfigError, ToolError
from tests.helpers import write_config

FREE: dict[str, Any] = {"command": sys.executable, "args": ["server.py"], "cwd": "/srv/tools"}
CONNECTOR: dict[str, Any] = {"id": "files", "name": "Files", "type": "mcp"}


def _user(tmp_path: Path, servers: dict[str, Any]) -> tuple[dict[str, ConnectorSpec], list[str]]:
    specs, problems = load_user_servers(write_config(tmp_path / "mcp.json", {"mcpServers": servers}))
    return {s.id: s for s in specs}, [p.message for p in problems]


def _package(tmp_path: Path, connector: dict[str, Any], entry: dict[str, Any]) -> Path:
    directory = tmp_path / "files"
    write_config(directory / "connector.json", connector)
    write_config(directory / "mcp.json", {"mcpServers": {"files": entry}})
    (directory / "server.py").write_text("")
    return directory


# -- the rule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("placeholder", SESSION_PLACEHOLDERS)
def test_every_per_session_placeholder_anywhere_in_the_launch_config_makes_it_per_session(placeholder: str) -> None:
    used = "${" + placeholder + "}"
    assert session_dependence("node", ["server.js"], {"A": "1"}, "/srv") is None
    assert session_dependence(f"/opt/{used}/node", [], {}, "/srv") == f"its command uses {used}"
    assert session_dependence("node", ["--root", f"x{used}"], {}, "/srv") == f"its args uses {used}"
    assert session_dependence("node", [], {"CTX": used}, "/srv") == f"its env CTX uses {used}"
    assert session_dependence("node", [], {}, f"{used}/sub") == f"its cwd uses {used}"


def test_a_config_without_a_cwd_runs_in_each_sessions_workspace_so_it_is_per_session() -> None:
    assert (
        session_dependence("node", ["server.js"], {}, None) == "it has no cwd, so it runs in each session's workspace"
    )


def test_the_daemons_origin_and_the_connector_root_are_the_same_in_every_session() -> None:
    assert (
        session_dependence("node", ["${SIDECAR_CONNECTOR_ROOT}/s.js"], {"O": "${SIDECAR_LOCAL_MCP_ORIGIN}"}, "/")
        is None
    )


def test_session_free_holds_for_stdio_configs_the_rule_accepts_only(tmp_path: Path) -> None:
    specs, problems = _user(
        tmp_path,
        {
            "free": FREE,
            "workspace": {**FREE, "cwd": "${SIDECAR_PROJECT_DIR}"},
            "nocwd": {"command": sys.executable},
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp"},
        },
    )
    assert problems == []
    assert {i: s.session_free for i, s in specs.items()} == {
        "free": True,
        "workspace": False,
        "nocwd": False,
        "remote": False,
    }
    assert all(s.process == "session" for s in specs.values())  # per-session processes stay the default


# -- the declaration ---------------------------------------------------------------------------------


def test_a_user_entry_may_ask_for_one_shared_process(tmp_path: Path) -> None:
    specs, problems = _user(tmp_path, {"free": {**FREE, "process": "shared"}, "own": {**FREE, "process": "session"}})
    assert problems == []
    assert (specs["free"].process, specs["own"].process) == ("shared", "session")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({**FREE, "args": ["--root", "${SIDECAR_PROJECT_DIR}"]}, r"its args uses \$\{SIDECAR_PROJECT_DIR\}"),
        ({**FREE, "env": {"C": "${SIDECAR_MCP_CONTEXT}"}}, r"its env C uses \$\{SIDECAR_MCP_CONTEXT\}"),
        ({"command": sys.executable, "args": ["s.py"]}, r"it has no cwd"),
    ],
)
def test_shared_is_refused_on_a_config_that_differs_per_session(
    tmp_path: Path, entry: dict[str, Any], reason: str
) -> None:
    specs, problems = _user(tmp_path, {"bad": {**entry, "process": "shared"}, "good": FREE})
    assert list(specs) == ["good"]  # the refused entry loads nothing; the others are unaffected
    [problem] = problems
    assert "mcpServers.bad" in problem
    assert '"process": "shared" needs a launch config that is the same in every session' in problem
    assert re.search(reason, problem)


def test_shared_is_refused_on_a_remote_server_and_on_a_value_it_does_not_know(tmp_path: Path) -> None:
    specs, problems = _user(
        tmp_path,
        {
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "process": "shared"},
            "typo": {**FREE, "process": "shard"},
        },
    )
    assert specs == {}
    assert len(problems) == 2
    assert any("remote (http) server has no process of sidecar's to share" in p for p in problems)
    assert any("mcpServers.typo.process" in p for p in problems)


def test_a_package_declares_sharing_in_its_connector_file_and_only_for_a_config_that_allows_it(tmp_path: Path) -> None:
    shared = {**CONNECTOR, "process": "shared"}
    assert load_package(_package(tmp_path, shared, {**FREE, "cwd": "${SIDECAR_CONNECTOR_ROOT}"})).process == "shared"
    with pytest.raises(ConfigError, match=r"connector\.json: process: .*it has no cwd"):
        load_package(_package(tmp_path, shared, {"command": sys.executable, "args": ["server.py"]}))
    with pytest.raises(ConfigError, match=r"mcpServers\.files\.process.*connector\.json"):
        load_package(_package(tmp_path, CONNECTOR, {**FREE, "process": "shared"}))


def test_sharing_changes_the_trust_key_and_per_session_keys_stay_as_they_were(tmp_path: Path) -> None:
    specs, _ = _user(tmp_path, {"free": FREE})
    own = specs["free"]
    shared = dataclasses.replace(own, process="shared")
    assert trust_key(shared) != trust_key(own)  # one process for every session is the user's decision
    assert b"process" not in canonical_launch(own)


# -- one session's view of a shared client --------------------------------------------------------------


class _Client:
    """A stand-in for ``ClientSession`` at the seam: a call that waits until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    async def call_tool(self, name: str) -> str:
        self.started.append(name)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(name)
            raise
        return f"done {name}"


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(5):
        while not predicate():
            await asyncio.sleep(0)


async def test_aborting_one_sessions_view_cancels_its_calls_only() -> None:
    client = _Client()
    first, second = SessionView("a", client), SessionView("b", client)
    mine = asyncio.create_task(first.call_tool("mine"))
    theirs = asyncio.create_task(second.call_tool("theirs"))
    await _until(lambda: len(client.started) == 2)
    assert first.abort() == 1
    with pytest.raises(ToolError, match="aborted: its session ended"):
        await mine
    assert client.cancelled == ["mine"]
    client.release.set()
    assert await theirs == "done theirs"
    with pytest.raises(ToolError, match="this session has ended"):
        await first.call_tool("later")
    assert client.started == ["mine", "theirs"]  # the refused call never reached the client


async def test_a_cancelled_caller_cancels_its_request_and_stays_cancelled() -> None:
    client = _Client()
    view = SessionView("a", client)
    caller = asyncio.create_task(view.call_tool("slow"))
    await _until(lambda: client.started == ["slow"])
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert client.cancelled == ["slow"]
    assert view.pending == 0


def test_a_view_counts_as_its_client_for_the_once_per_process_drift_check() -> None:
    client = _Client()
    checked: weakref.WeakSet[Any] = weakref.WeakSet()
    assert SessionView("a", client) not in checked
    checked.add(client)
    assert SessionView("a", client) in checked and SessionView("b", client) in checked
    assert SessionView("c", _Client()) not in checked
