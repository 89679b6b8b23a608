"""A session owned by a process ends when that process is gone (not when its pid is merely reused)."""

from __future__ import annotations

import asyncio
import os
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.owners import Owner, watching_owners
from sidecar.auth.sessions import SessionStore
from sidecar.errors import EnvelopeRejected, RequestRejected
from sidecar.system import read_stat


def test_an_owner_is_this_very_process_not_its_pid() -> None:
    me = Owner.of(os.getpid())
    assert me.start is not None and not me.gone()
    stat = read_stat(os.getpid())
    assert stat is not None
    assert Owner(os.getpid(), stat.start + 1).gone()  # same pid, another process: gone


@pytest.mark.parametrize("pid", [0, 1, -5, 2**22 + 1])
def test_a_process_that_is_not_running_cannot_own_a_session(pid: int) -> None:
    with pytest.raises(RequestRejected, match="not running"):
        Owner.of(pid)


async def test_a_session_ends_once_its_owner_is_gone_and_others_live_on(tmp_path: Path) -> None:
    sessions = SessionStore(InflightTracker(), default_ttl=3600, max_ttl=7200)
    stat = read_stat(os.getpid())
    assert stat is not None
    ended: list[str] = []
    sessions.subscribe(lambda session, event: ended.append(session.id) if event == "ended" else None)
    mine, mine_envelope = sessions.create(project_id="p", workspace=str(tmp_path), owner=Owner.of(os.getpid()))
    orphan, orphan_envelope = sessions.create(
        project_id="p", workspace=str(tmp_path), owner=Owner(os.getpid(), stat.start + 1)
    )
    free, _ = sessions.create(project_id="p", workspace=str(tmp_path))

    async with watching_owners(sessions.owned, sessions.end, interval=0.01):
        async with asyncio.timeout(10):
            while orphan.id not in ended:
                await asyncio.sleep(0.01)
    assert ended == [orphan.id]
    with pytest.raises(EnvelopeRejected):
        sessions.verify(orphan_envelope)
    assert sessions.verify(mine_envelope).id == mine.id
    assert {s.id for s in sessions.list()} == {mine.id, free.id}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds on this platform")
async def test_a_session_ends_the_moment_its_agent_exits_not_at_the_next_look(tmp_path: Path) -> None:
    sessions = SessionStore(InflightTracker(), default_ttl=3600, max_ttl=7200)
    ended: list[str] = []
    sessions.subscribe(lambda session, event: ended.append(session.id) if event == "ended" else None)
    agent = await asyncio.create_subprocess_exec(sys.executable, "-c", "import sys; sys.stdin.read()", stdin=PIPE)
    try:
        session, _ = sessions.create(project_id="p", workspace=str(tmp_path), owner=Owner.of(os.getpid()))
        sessions.name_agent(session.id, Owner.of(agent.pid))
        assert sessions.get(session.id).public()["agent_pid"] == agent.pid
        # One look an hour: only the pidfd taken at the first look can end the session in time.
        async with watching_owners(sessions.owned, sessions.end, interval=3600):
            await asyncio.sleep(0)  # the first look runs
            assert ended == []
            assert agent.stdin is not None
            agent.stdin.close()
            await agent.wait()
            async with asyncio.timeout(5):
                while session.id not in ended:
                    await asyncio.sleep(0.01)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert sessions.list() == []


def test_a_session_names_its_agent_once(tmp_path: Path) -> None:
    sessions = SessionStore(InflightTracker(), default_ttl=3600, max_ttl=7200)
    session, _ = sessions.create(project_id="p", workspace=str(tmp_path))
    sessions.name_agent(session.id, Owner.of(os.getpid()))
    with pytest.raises(RequestRejected, match="already ends with"):
        sessions.name_agent(session.id, Owner.of(os.getppid()))
    assert [owner.pid for _, owner in sessions.owned()] == [os.getpid()]
