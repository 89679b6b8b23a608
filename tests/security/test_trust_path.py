"""The trust store's whole path is checked, not only the file (issue 11 item 4).

A state or config directory that group or others may write, or that another user owns, or a directory
above them that others may change, is as unsafe as a loose ``approvals.json``: whoever may rename entries
there may put an older store (or a stale temp file) in place of ours. Against the real daemon:

- at start, an unsafe config directory means nothing is trusted; ``sidecar status`` and the audit log
  say why; trust changes are refused and write nothing;
- loosened while the daemon runs, the last good trust stays in force and nothing is written there;
- an unsafe state directory, or an ancestor others may change, stops the daemon before it writes its
  control token (``runtime.json``) there.

Each test ends with the daemon (if one runs) still answering ``/healthz``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from sidecar.errors import StorageError
from sidecar.paths import Paths
from tests.conftest import Daemon, running_daemon
from tests.helpers import request_json

CONNECTOR: Final = "workspace"
"""A connector the repository ships: trusting it in a seeded store needs no process."""
OTHER_UID: Final = 4242


def _paths(root: Path) -> Paths:
    return Paths(config=root / "config", state=root / "state", data=root / "data")


def _private_dirs(paths: Paths) -> None:
    for directory in (paths.config, paths.state, paths.data):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)


@pytest.fixture
async def trust_key(tmp_path: Path, workspace: Path) -> str:
    """The trust key of the shipped connector, as a daemon in a safe home computes it."""
    async with running_daemon(_paths(tmp_path / "probe"), workspace) as daemon:
        shown = await daemon.control("GET", f"/control/connectors/{CONNECTOR}")
    return str(shown["trust_key"])


def _seed_trust(paths: Paths, key: str) -> bytes:
    """An ``approvals.json`` (0600) that trusts the shipped connector; returns its bytes."""
    document = {
        "version": 1,
        "connectors": {key: {"name": CONNECTOR, "trusted_at": "2026-01-02T03:04:05Z", "tools": {}}},
    }
    data = json.dumps(document).encode()
    store = paths.state / "approvals.json"
    store.write_bytes(data)
    store.chmod(0o600)
    return data


def _make_group_writable(directory: Path) -> None:
    directory.chmod(0o770)


def _make_world_writable(directory: Path) -> None:
    directory.chmod(0o777)


def _give_away(directory: Path) -> None:
    os.chown(directory, OTHER_UID, -1)


UNSAFE: Final[dict[str, tuple[Callable[[Path], None], str]]] = {
    "group-writable": (_make_group_writable, "may be written by other users (mode 770)"),
    "world-writable": (_make_world_writable, "may be written by other users (mode 777)"),
    "someone else's": (_give_away, f"belongs to uid {OTHER_UID}"),
}

needs_root_to_give_away = pytest.mark.skipif(os.getuid() != 0, reason="only root can chown a directory away")


def _unsafe_params() -> list[Any]:
    return [
        pytest.param(*UNSAFE[name], id=name, marks=[needs_root_to_give_away] if name == "someone else's" else [])
        for name in UNSAFE
    ]


async def _status(daemon: Daemon) -> dict[str, Any]:
    status: dict[str, Any] = await daemon.control("GET", "/control/status")
    return status


async def _connector_state(daemon: Daemon) -> str:
    shown = await daemon.control("GET", f"/control/connectors/{CONNECTOR}")
    return str(shown["state"])


async def _assert_healthy(daemon: Daemon) -> None:
    status, body = await request_json("GET", f"{daemon.url}/healthz")
    assert (status, body) == (200, {"status": "ok"})


def _listing(directory: Path) -> dict[str, int]:
    return {entry.name: entry.stat().st_ino for entry in os.scandir(directory)}


async def test_a_seeded_store_in_a_safe_home_is_in_force(tmp_path: Path, workspace: Path, trust_key: str) -> None:
    # The positive control for the tests below: the same seed, in a home where every directory is ours.
    paths = _paths(tmp_path / "home")
    _private_dirs(paths)
    _seed_trust(paths, trust_key)
    async with running_daemon(paths, workspace) as daemon:
        assert await _connector_state(daemon) == "trusted"
        status = await _status(daemon)
        assert status["trust_store_problem"] is None
        assert f"connector:{CONNECTOR}" in status["routes"]


@pytest.mark.parametrize(("make_unsafe", "reason"), _unsafe_params())
async def test_an_unsafe_config_directory_at_start_means_nothing_is_trusted_and_status_says_why(
    tmp_path: Path, workspace: Path, trust_key: str, make_unsafe: Callable[[Path], None], reason: str
) -> None:
    paths = _paths(tmp_path / "home")
    _private_dirs(paths)
    seeded = _seed_trust(paths, trust_key)
    make_unsafe(paths.config)

    async with running_daemon(paths, workspace) as daemon:
        assert await _connector_state(daemon) != "trusted"
        status = await _status(daemon)
        problem = status["trust_store_problem"]
        assert problem is not None and str(paths.config) in problem and reason in problem, problem
        assert f"connector:{CONNECTOR}" not in status["routes"]
        refusals = daemon.audit_events("trust.store_refused")
        assert refusals and refusals[0]["problem"] == problem, refusals

        # A trust change is refused before anything starts, and writes nothing.
        before = _listing(paths.state)
        for action in ("trust", "untrust"):
            code, body = await request_json(
                "POST",
                f"{daemon.url}/control/connectors/{CONNECTOR}/{action}",
                headers={"Authorization": f"Bearer {daemon.control_token}"},
            )
            assert code == 500 and body["error"]["code"] == "storage_error", (action, code, body)
        assert (paths.state / "approvals.json").read_bytes() == seeded
        assert {n for n in _listing(paths.state) if not n.startswith("audit")} == {
            n for n in before if not n.startswith("audit")
        }
        assert not daemon.audit_events("trust.granted") and not daemon.audit_events("trust.revoked")
        await _assert_healthy(daemon)


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o775], ids=["777", "757", "775"])
async def test_a_state_directory_loosened_while_running_keeps_the_last_good_trust_and_writes_nothing(
    tmp_path: Path, workspace: Path, trust_key: str, mode: int
) -> None:
    paths = _paths(tmp_path / "home")
    _private_dirs(paths)
    seeded = _seed_trust(paths, trust_key)
    async with running_daemon(paths, workspace) as daemon:
        assert await _connector_state(daemon) == "trusted"
        runtime = (paths.state / "runtime.json").read_bytes()
        paths.state.chmod(mode)
        try:
            status = await _status(daemon)
            problem = status["trust_store_problem"]
            assert problem is not None and str(paths.state) in problem, problem
            assert f"mode {mode:o}" in problem
            assert [e["problem"] for e in daemon.audit_events("trust.store_refused")] == [problem]
            # The last good snapshot stays in force ...
            assert await _connector_state(daemon) == "trusted"
            assert f"connector:{CONNECTOR}" in status["routes"]
            # ... and no change is written into a directory others may write.
            before = _listing(paths.state)
            code, body = await request_json(
                "POST",
                f"{daemon.url}/control/connectors/{CONNECTOR}/untrust",
                headers={"Authorization": f"Bearer {daemon.control_token}"},
            )
            assert code == 500 and body["error"]["code"] == "storage_error", body
            after = _listing(paths.state)
            assert after == before, set(after) ^ set(before)  # no temp file, no replaced file
            assert (paths.state / "approvals.json").read_bytes() == seeded
            assert (paths.state / "runtime.json").read_bytes() == runtime
            assert stat.S_IMODE(paths.state.stat().st_mode) == mode  # left as evidence, not quietly tightened
            await _assert_healthy(daemon)
        finally:
            paths.state.chmod(0o700)
        assert (await _status(daemon))["trust_store_problem"] is None  # fixed: in force again


@pytest.mark.parametrize(("make_unsafe", "reason"), _unsafe_params())
async def test_an_unsafe_state_directory_stops_the_daemon_before_it_writes_its_token(
    tmp_path: Path, workspace: Path, make_unsafe: Callable[[Path], None], reason: str
) -> None:
    paths = _paths(tmp_path / "home")
    _private_dirs(paths)
    make_unsafe(paths.state)
    with pytest.raises(StorageError, match=re.escape(reason)):
        async with running_daemon(paths, workspace):
            pass
    assert not (paths.state / "runtime.json").exists()
    assert not (paths.state / "daemon.lock").exists()


@pytest.mark.parametrize(
    ("mode", "starts"),
    [(0o777, False), (0o775, False), (0o1777, True), (0o755, True)],
    ids=["777-refused", "775-refused", "1777-sticky-starts", "755-starts"],
)
async def test_a_directory_above_the_state_directory_counts_too(
    tmp_path: Path, workspace: Path, mode: int, starts: bool
) -> None:
    # <home> holds state/: whoever may rename entries in it may swap state/ for a directory of theirs. A
    # sticky directory (as /tmp) is safe: others cannot rename what is not theirs there.
    root = tmp_path / "home"
    paths = _paths(root)
    _private_dirs(paths)
    root.chmod(mode)
    if starts:
        async with running_daemon(paths, workspace) as daemon:
            assert (await _status(daemon))["trust_store_problem"] is None
            await _assert_healthy(daemon)
        return
    with pytest.raises(StorageError, match=re.escape(f"{root} may be written by other users")):
        async with running_daemon(paths, workspace):
            pass
    assert not (paths.state / "runtime.json").exists()
