"""The command-line watcher the secret-on-argv tests rely on: it must see what starts while it watches
(or those tests could not fail), and only that (or any process of the machine, a CI runner's script say,
could fail them)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.attackers import needs_other_user, watching_command_lines

pytestmark = pytest.mark.slow  # it starts processes

MARK = "code=watched-mark"


async def _sleeper(word: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", word, stdin=asyncio.subprocess.PIPE
    )


async def _end(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 10)


@needs_other_user()
async def test_the_watcher_sees_a_process_started_while_it_watches_and_none_from_before() -> None:
    before = await _sleeper(f"{MARK}-before")
    try:
        async with watching_command_lines() as seen:
            during = await _sleeper(f"{MARK}-during")
            await _end(during)
    finally:
        await _end(before)
    marked = [line for line in seen if MARK in line]
    assert len(marked) == 1 and marked[0].split()[-1] == f"{MARK}-during", marked
