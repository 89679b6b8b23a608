"""The README's quickstart as a newcomer runs it: its first two blocks, verbatim, in an empty ``HOME``.

The first block (``scripts/run``) runs in the background until it says it is listening; the second runs
under ``bash -e`` against it, and the configuration it prints must work with the MCP SDK's own client.
Only the port differs from a newcomer's machine (``SIDECAR_PORT=0``, which the README documents), so the
test cannot collide with a daemon on 7437.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.conftest import mcp_client
from tests.helpers import tool_text

pytestmark = pytest.mark.slow  # a daemon and the CLI are processes

ROOT: Final = Path(__file__).resolve().parent.parent
START_BOUND: Final = 300.0
"""Seconds the first block may take to say it listens (it may install the project into .venv first)."""
BOUND: Final = 60.0


def quickstart_blocks() -> list[str]:
    """The fenced ``bash`` blocks of the README's Quickstart section, as written."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _newcomer_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "PYTEST", "XDG_"))}
    return {**env, "HOME": str(home), "SIDECAR_PORT": "0"}


async def test_the_readme_quickstart_runs_verbatim_in_an_empty_home(tmp_path: Path) -> None:
    first, second = quickstart_blocks()[:2]  # start the daemon; use it (the later blocks are examples)
    assert first.strip() == "scripts/run"
    home = tmp_path / "home"
    home.mkdir()
    env = _newcomer_env(home)
    daemon = await asyncio.create_subprocess_exec(
        "bash", "-c", first, cwd=ROOT, env=env, start_new_session=True,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert daemon.stdout is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(START_BOUND):
            while not any("listening on http://127.0.0.1:" in line for line in said):
                line = await daemon.stdout.readline()
                assert line, f"scripts/run ended before it listened: {said}"
                said.append(line.decode(errors="replace"))
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-e", "-c", second],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BOUND,
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert re.search(r"sidecar \S+ running \(pid \d+\)", done.stdout), done.stdout
        config = json.loads(done.stdout[done.stdout.index("\n{") :])
        assert (home / "code" / "myproject").is_dir()
        assert config["session_id"].startswith("s_") and config["url"].endswith("/mcp")
        async with asyncio.timeout(BOUND), mcp_client(config) as client:
            assert tool_text(await client.call_tool("calculate", {"expression": "6*7"})) == "42"
    finally:
        if daemon.returncode is None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(daemon.wait(), BOUND)
            except TimeoutError:
                os.killpg(daemon.pid, signal.SIGKILL)
                await daemon.wait()
    assert daemon.returncode == 0  # SIGTERM is a graceful stop
