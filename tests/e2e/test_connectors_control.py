"""Connector trust through the control API: states, trust pinned to content, install, a refused store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon
from tests.helpers import ECHO_SERVER, python_server, trust, write_user_servers

REPO = Path(__file__).resolve().parents[2]


def _states(listing: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["state"] for c in listing["connectors"]}


TIME_SERVER = python_server(ECHO_SERVER, env={"TZ": "UTC"})


async def test_sources_are_listed_untrusted_and_a_broken_entry_hides_nothing(daemon: Daemon) -> None:
    write_user_servers(daemon, {"time": TIME_SERVER, "broken": {"args": ["x"]}})
    listing = await daemon.control("GET", "/control/connectors")
    assert _states(listing) == {"workspace": "configured", "time": "configured"}
    [problem] = listing["problems"]
    assert "mcp.json" in problem and "broken" in problem and "command" in problem


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
    ]:
        write_user_servers(daemon, {"time": {**TIME_SERVER, field: value}})
        assert _states(await daemon.control("GET", "/control/connectors"))["time"] == "disconnected", field
    write_user_servers(daemon, {"time": {**TIME_SERVER, "env": {"TZ": "Europe/Paris"}}})  # a value, not a key
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
