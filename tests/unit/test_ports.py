"""The fixed port: who holds it when it is taken, and the daemon's refusal naming them."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.cli.options import duration
from sidecar.config import DEFAULT_PORT, Settings, load_settings
from sidecar.daemon import serve
from sidecar.errors import Conflict
from sidecar.paths import Paths
from sidecar.system import port_holders


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_the_default_port_is_fixed_and_settings_or_flags_change_it(tmp_path: Path) -> None:
    assert load_settings(None, env={}).port == DEFAULT_PORT != 0
    file = tmp_path / "sidecar.toml"
    file.write_text("port = 9123\n")
    assert load_settings(file, env={}).port == 9123
    assert load_settings(file, env={}, overrides={"port": 0}).port == 0


def test_the_holder_of_a_port_is_named_by_pid_and_command(held_port: int) -> None:
    holders = port_holders(held_port)
    assert [h.pid for h in holders] == [os.getpid()]
    assert "pytest" in holders[0].command or "python" in holders[0].command
    assert holders[0].uid == os.getuid()


def test_a_free_port_has_no_holder() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening
    assert port_holders(port) == []


async def test_the_daemon_refuses_a_taken_port_naming_the_holder_and_writes_no_runtime_file(
    held_port: int, home: Path
) -> None:
    paths = Paths.resolve()
    with pytest.raises(Conflict) as refused:
        await serve(Settings(port=held_port), paths)
    message = str(refused.value)
    assert f"port {held_port}" in message and f"pid {os.getpid()}" in message
    assert "--port" in message and str(paths.settings_file) in message
    assert not paths.runtime_file.exists()


@pytest.mark.parametrize(
    ("text", "seconds"), [("3600", 3600), ("90m", 5400), ("12h", 43200), ("30d", 2592000), ("45s", 45), ("2D", 172800)]
)
def test_ttl_durations(text: str, seconds: int) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "1w", "-5", "1.5h", "30 days", "9999999999"])
def test_ttl_durations_that_are_not(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)
