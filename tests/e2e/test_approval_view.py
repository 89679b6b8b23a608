"""An approval shows what it approves: each top-level argument on its own, short values first, each
bounded on its own with how much is left, in the control API, the CLI and (``approvals show``) in full.

A long value must never hide another key (issue 21): a call whose first argument is 5 000 characters
still shows its ``path``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sidecar.bus.approvals import MAX_VALUE_SHOWN
from tests.conftest import Daemon, mcp_client
from tests.helpers import tool_text, trust

LONG = "A" * 5000


async def _cli(*argv: str) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", *argv],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _waiting_write(daemon: Daemon) -> dict[str, Any]:
    await trust(daemon, "workspace")
    session = await daemon.new_session(allow=["mcp__workspace__*"])
    async with mcp_client(session) as client:
        # The long value first, as an agent hiding the path behind it would send it.
        waiting = await client.call_tool("mcp__workspace__write_file", {"content": LONG, "path": "notes/plan.txt"})
    assert waiting.is_error and "needs the user's approval" in tool_text(waiting)
    [pending] = (await daemon.control("GET", "/control/approvals"))["approvals"]
    return pending  # type: ignore[no-any-return]


@pytest.mark.slow  # the workspace connector runs as a process
async def test_a_long_first_argument_cannot_hide_the_path(daemon: Daemon) -> None:
    pending = await _waiting_write(daemon)
    path, content = pending["arguments"]
    assert path == {"name": "path", "value": '"notes/plan.txt"', "more": 0}
    assert content["name"] == "content"
    assert content["value"] == ('"' + LONG)[:MAX_VALUE_SHOWN]
    assert content["more"] == len(LONG) + 2 - MAX_VALUE_SHOWN  # the JSON string's quotes count

    whole = await daemon.control("GET", f"/control/approvals/{pending['approval_id']}")
    assert [a["value"] for a in whole["arguments"]] == ['"notes/plan.txt"', json.dumps(LONG)]
    assert not (daemon.workspace / "notes").exists()  # nothing ran while it waits


@pytest.mark.slow
async def test_the_cli_lists_each_argument_and_shows_the_whole_on_request(daemon: Daemon) -> None:
    pending = await _waiting_write(daemon)
    listed = (await _cli("approvals", "list")).splitlines()
    head = next(i for i, line in enumerate(listed) if pending["approval_id"] in line)
    assert listed[head + 1].strip() == 'path: "notes/plan.txt"'
    more = len(LONG) + 2 - MAX_VALUE_SHOWN
    assert listed[head + 2].endswith(f"… {more} more characters: sidecar approvals show {pending['approval_id']}")
    shown = await _cli("approvals", "show", pending["approval_id"])
    assert f"    content: {json.dumps(LONG)}" in shown.splitlines()
    assert 'path: "notes/plan.txt"' in shown


async def test_an_unknown_approval_is_a_404(daemon: Daemon) -> None:
    refused = await daemon.control("GET", "/control/approvals/ap_nope", expect=404)
    assert "no approval" in refused["error"]["message"]
