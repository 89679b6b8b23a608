"""Connector trust through the control API: states, trust pinned to content, install, a refused store."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon, cli_output, mcp_client, sidecar_env
from tests.helpers import ECHO_SERVER, python_server, trust, write_user_servers

REPO = Path(__file__).resolve().parents[2]


def _states(listing: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["state"] for c in listing["connectors"]}


TIME_SERVER = python_server(ECHO_SERVER, env={"TZ": "UTC"})


async def test_sources_are_listed_untrusted_and_a_broken_entry_hides_nothing(daemon: Daemon) -> None:
    write_user_servers(daemon, {"time": TIME_SERVER, "broken": {"args": ["x"]}})
    listing = await daemon.control("GET", "/control/connectors")
    assert _states(listing) == {"workspace": "configured", "github": "configured", "time": "configured"}
    [problem] = listing["problems"]
    assert "mcp.json" in problem and "broken" in problem and "command" in problem


async def test_a_remote_server_declaring_an_oauth_client_added_while_running_needs_a_sign_in(
    daemon: Daemon,
) -> None:
    remote = {"type": "http", "url": "https://mcp.example.com/mcp"}
    write_user_servers(daemon, {"plain": remote, "signed": {**remote, "oauth": {"clientId": "sidecar-app"}}})
    await daemon.control("GET", "/control/connectors")  # the listing reads the config as it is now
    signed = await daemon.control("GET", "/control/connectors/signed")
    assert (signed["auth"], signed["auth_reason"]) == ("unauthorized", "not signed in yet"), signed
    plain = await daemon.control("GET", "/control/connectors/plain")
    assert (plain["auth"], plain["auth_reason"]) == ("none", None), plain  # none until its server asks


@pytest.mark.slow
async def test_trust_is_pinned_to_the_config_as_it_is_now(daemon: Daemon) -> None:
    write_user_servers(daemon, {"time": TIME_SERVER})
    shown = await trust(daemon, "time")
    assert shown["trust_key"].startswith("time::")
    store = daemon.paths.state / "approvals.json"
    assert oct(store.stat().st_mode & 0o777) == "0o600"
    assert shown["trust_key"] in store.read_text()

    for field, value in [
        ("args", ["mcp-server-time", "--local-timezone", "UTC"]),
        ("command", "uv"),
        ("env", {"TZ": "UTC", "EXTRA": "1"}),
        ("cwd", "/tmp"),
        ("env", {"TZ": "Europe/Paris"}),  # a value: it can run code as a key can (LD_PRELOAD)
    ]:
        write_user_servers(daemon, {"time": {**TIME_SERVER, field: value}})
        assert _states(await daemon.control("GET", "/control/connectors"))["time"] == "changed", field
    write_user_servers(daemon, {"time": TIME_SERVER})  # back to what was trusted
    assert _states(await daemon.control("GET", "/control/connectors"))["time"] == "trusted"

    write_user_servers(daemon, {"clock": TIME_SERVER})  # the same config under another name
    assert _states(await daemon.control("GET", "/control/connectors"))["clock"] == "configured"

    events = [r["event"] for r in daemon.audit_events() if r["event"].startswith("trust.")]
    assert events == ["trust.granted", "trust.tools_approved"]


@pytest.mark.slow
async def test_untrust_and_retrust(daemon: Daemon) -> None:
    await trust(daemon, "workspace")
    assert (await daemon.control("POST", "/control/connectors/workspace/untrust"))["state"] == "configured"
    assert _states(await daemon.control("GET", "/control/connectors"))["workspace"] == "configured"
    events = [r["event"] for r in daemon.audit_events() if r["event"].startswith("trust.")]
    assert events == ["trust.granted", "trust.tools_approved", "trust.revoked"]


async def test_install_validates_and_copies_a_package(daemon: Daemon, tmp_path: Path) -> None:
    package = tmp_path / "files2"
    shutil.copytree(REPO / "connectors" / "workspace", package, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = json.loads((package / "connector.json").read_text())
    (package / "connector.json").write_text(json.dumps({**manifest, "id": "files2"}))
    installed = await daemon.control("POST", "/control/connectors/install", {"path": str(package)}, expect=201)
    assert (installed["id"], installed["state"]) == ("files2", "configured")
    assert (daemon.paths.data / "connectors" / "files2" / "server.py").is_file()
    again = await daemon.control("POST", "/control/connectors/install", {"path": str(package)}, expect=409)
    assert "already exists" in again["error"]["message"]

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "connector.json").write_text("{not json")
    refused = await daemon.control("POST", "/control/connectors/install", {"path": str(broken)}, expect=500)
    assert "connector.json" in refused["error"]["message"]
    assert not (daemon.paths.data / "connectors" / "broken").exists()


@pytest.mark.slow
async def test_a_tampered_trust_store_is_refused_and_trusts_nothing(daemon: Daemon, tmp_path: Path) -> None:
    await trust(daemon, "workspace")
    store = daemon.paths.state / "approvals.json"
    evidence = tmp_path / "elsewhere.json"
    original = store.read_text()
    evidence.write_text(original)
    evidence.chmod(0o600)
    store.unlink()
    store.symlink_to(evidence)
    refused = await daemon.control("POST", "/control/connectors/workspace/trust", expect=500)
    assert refused["error"]["code"] == "storage_error"
    assert store.is_symlink() and evidence.read_text() == original  # the evidence is left as it was
    # The last good snapshot stays in force: what was trusted stays trusted, nothing more.
    assert _states(await daemon.control("GET", "/control/connectors"))["workspace"] == "trusted"


# --- the last failure: which session, when, why, and the end of its stderr ------------------------------

DYING = str(REPO / "tests" / "connectors" / "fixtures" / "dying.py")
SECRET = "sk-live-never-shown-7f3a"
BOUND = 30.0
"""Seconds any one wait may take (a fail-safe, not a timing assertion)."""


def _dying(**env: str) -> dict[str, Any]:
    # PYTHONIOENCODING: the fixture's non-ASCII stderr goes out as UTF-8 whatever the test's locale.
    environment = {"API_TOKEN": SECRET, "PYTHONIOENCODING": "utf-8", **env}
    return {"command": sys.executable, "args": [DYING], "env": environment}


def _assert_last_words(failure: dict[str, Any] | None, *, session_id: str) -> None:
    """dying.py's 28 lines, as ``connectors show`` keeps them: the last 20, escaped, each cut at 300."""
    assert failure is not None
    assert failure["session_id"] == session_id
    assert failure["reason"] == "exited with code 7"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", failure["at"]), failure["at"]
    stderr = failure["stderr"]
    assert len(stderr) == 20
    assert stderr[:2] == ["dying: line 8", "dying: line 9"]
    assert stderr[-3] == "dying: \\x1b[31mred\\x1b[0m \\u202eevil"  # escaped: no terminal escape, no bidi
    assert stderr[-2].startswith("dying: xxx") and stderr[-2].endswith("...") and len(stderr[-2]) == 300
    assert stderr[-1] == "dying: fatal: the upstream API refused us"


async def _cli(home: Path, *args: str) -> str:
    """``python -m sidecar ARGS`` against the in-process daemon, without blocking its event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sidecar",
        *args,
        env=sidecar_env(home),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(BOUND):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")
    return out.decode()


@pytest.mark.slow
async def test_a_connector_that_fails_to_start_shows_its_last_stderr_lines(daemon: Daemon, home: Path) -> None:
    write_user_servers(daemon, {"dying": _dying(DIE_AT_START="1")})
    trusted = await daemon.control("POST", "/control/connectors/dying/trust")
    assert trusted["state"] == "error" and "exited with code 7" in trusted["error"], trusted
    shown = await daemon.control("GET", "/control/connectors/dying")
    _assert_last_words(shown["last_failure"], session_id="probe:dying")  # the probe that trusting runs
    assert "API_TOKEN" in shown["env_keys"] and SECRET not in json.dumps(shown)

    as_json, as_text = await asyncio.gather(
        _cli(home, "connectors", "show", "dying", "--json"), _cli(home, "connectors", "show", "dying")
    )
    assert json.loads(as_json)["last_failure"] == shown["last_failure"]
    assert "session probe:dying: exited with code 7" in as_text
    assert "  | dying: fatal: the upstream API refused us" in as_text
    assert "  | dying: \\x1b[31mred" in as_text and "\x1b" not in as_text and "\u202e" not in as_text
    assert SECRET not in as_json + as_text


@pytest.mark.slow
async def test_a_connector_that_dies_mid_call_shows_the_session_and_logs_its_stderr_once(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    write_user_servers(daemon, {"dying": _dying()})
    assert (await daemon.control("POST", "/control/connectors/dying/trust"))["state"] == "trusted"
    assert (await daemon.control("GET", "/control/connectors/dying"))["last_failure"] is None
    caplog.set_level(logging.WARNING, logger="sidecar.connectors.failures")
    session = await daemon.new_session(mode="bypass", allow=["mcp__dying__*"])
    async with mcp_client(session) as client:
        result = await client.call_tool("mcp__dying__die", {})
    assert result.is_error and "stopped unexpectedly" in str(result.content), result
    shown = await daemon.control("GET", "/control/connectors/dying")
    _assert_last_words(shown["last_failure"], session_id=session["session_id"])

    [logged] = [r for r in caplog.records if r.name == "sidecar.connectors.failures"]
    assert logged.levelno == logging.WARNING
    message = logged.getMessage()
    assert session["session_id"] in message and "exited with code 7" in message
    assert "  | dying: fatal: the upstream API refused us" in message and "\x1b" not in message
    assert "dying: line 7" not in message and len(message) < 20 * 300 + 500
    assert SECRET not in caplog.text


@pytest.mark.slow
async def test_a_relayed_connector_that_dies_mid_call_shows_the_session_and_its_stderr(daemon: Daemon) -> None:
    write_user_servers(daemon, {"dying": _dying()})
    assert (await daemon.control("POST", "/control/connectors/dying/trust"))["state"] == "trusted"
    session = await daemon.new_session(mode="bypass", connector="dying")
    async with mcp_client(session) as client:
        with pytest.raises(Exception, match="connector dying stopped"):
            await client.call_tool("die", {})
        async with asyncio.timeout(BOUND):  # the relay reports it once the process is fully stopped
            while (failure := (await daemon.control("GET", "/control/connectors/dying"))["last_failure"]) is None:
                await asyncio.sleep(0.05)
    _assert_last_words(failure, session_id=session["session_id"])


@pytest.mark.slow
async def test_show_lists_a_user_servers_tools_with_their_risk_and_says_while_it_learns_them(
    daemon: Daemon, home: Path, tmp_path: Path
) -> None:
    # The server answers only once the gate exists, so the probe after Trust is seen in flight.
    gate = tmp_path / "gate"
    script = (
        "import pathlib, runpy, sys, time\n"
        f"while not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.02)\n"
        f"sys.path.insert(0, {str(ECHO_SERVER.parent)!r})\n"
        f"runpy.run_path({str(ECHO_SERVER)!r}, run_name='__main__')\n"
    )
    sees = {"readPaths": [str(tmp_path), str(ECHO_SERVER.parent)]}  # what its sandbox must show it
    write_user_servers(daemon, {"echo": {"command": sys.executable, "args": ["-c", script], "sidecarSandbox": sees}})
    before = await cli_output(home, "connectors", "show", "echo")
    assert "tools        learned when it is trusted" in before
    trusting = asyncio.create_task(daemon.control("POST", "/control/connectors/echo/trust"))
    async with asyncio.timeout(BOUND):
        while not (await daemon.control("GET", "/control/connectors/echo"))["learning_tools"]:
            await asyncio.sleep(0.05)
    assert "learning them now" in await cli_output(home, "connectors", "show", "echo")
    gate.touch()
    async with asyncio.timeout(BOUND):
        assert (await trusting)["state"] == "trusted"
    shown = await cli_output(home, "connectors", "show", "echo")
    assert "  MEDIUM mcp__echo__echo" in shown and "  MEDIUM mcp__echo__crash" in shown, shown
    listed = await daemon.control("GET", "/control/connectors/echo")
    assert listed["learning_tools"] is False
    assert {"name": "mcp__echo__echo", "risk": "MEDIUM"} in listed["tools"]


@pytest.mark.slow
async def test_a_user_server_declares_its_tools_risk_and_a_change_of_it_needs_trust_again(daemon: Daemon) -> None:
    low = {**python_server(ECHO_SERVER), "tools": {"echo": {"risk": "LOW"}, "crash": {"risk": "HIGH"}}}
    write_user_servers(daemon, {"echo": low})
    await trust(daemon, "echo")
    session = await daemon.new_session(mode="read-only", allow=["mcp__echo__*"])
    async with mcp_client(session) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        ran = await client.call_tool("mcp__echo__echo", {"text": "low"})
    assert "mcp__echo__echo" in names and "mcp__echo__crash" not in names  # HIGH is never exposed
    assert "mcp__echo__sleep" not in names  # undeclared: MEDIUM, not for a read-only session
    assert not ran.is_error
    # Declaring a tool less risky would let it run unasked: it is another config, to be trusted again.
    write_user_servers(daemon, {"echo": {**low, "tools": {"echo": {"risk": "LOW"}, "sleep": {"risk": "LOW"}}}})
    listing = await daemon.control("GET", "/control/connectors")
    assert {c["id"]: c["state"] for c in listing["connectors"]}["echo"] == "changed"
