"""One connector process: the SDK's own client over our transport, real subprocesses, and no leaks.

Fixture connectors live in ``fixtures/``: ``echo_server.py`` (an SDK server: echo, crash, sleep, env_keys,
argv), ``forker.py`` (a server whose tree tries to escape), ``hang.py`` (ignores stdin EOF and SIGTERM) and
``flood.py`` (answers with a 10 MiB line). Every wait is bounded; the autouse ``no_leaked_processes``
fixture in ``tests/conftest.py`` also checks that no child of the test runner survives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, TextContent

from sidecar.connectors.stdio.process import (
    STOP_BOUND,
    ConnectorProcess,
    ProcessLimits,
    ProcessState,
    ProcessStateError,
)
from sidecar.system import pid_alive

FIXTURES = Path(__file__).parent / "fixtures"
WAIT = 20.0
"""Seconds any single step may take before the test fails (a fail-safe, not a timing assertion)."""
REAP_WAIT = 10.0
"""Seconds for PID 1 (or a subreaper) to reap the killed orphans, which frees their process group id."""
BASE_ENV = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8"}
"""What a scrubbed connector environment looks like. LC_ALL stops Python's C-locale coercion from adding
LC_CTYPE to the child's own environment (PEP 538), which would muddy the exact-environment check."""


def connector(script: str, *args: str, env: dict[str, str] | None = None) -> ConnectorProcess:
    argv = [sys.executable, str(FIXTURES / script), *args]
    return ConnectorProcess(argv, env=BASE_ENV if env is None else env, cwd=None, name=script)


@asynccontextmanager
async def session(process: ConnectorProcess) -> AsyncIterator[Client]:
    async with asyncio.timeout(WAIT), Client(process.transport(), mode="legacy") as client:
        yield client


async def call_text(client: Client, tool: str, **arguments: object) -> str:
    async with asyncio.timeout(WAIT):
        result = await client.call_tool(tool, dict(arguments))
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def is_alive(pid: int, created: float) -> bool:
    """Whether that very process (not a later one reusing the pid) still runs; a zombie is dead."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def assert_group_gone(pgid: int) -> None:
    """``killpg(pgid, 0)`` raises ProcessLookupError once every member is dead *and reaped*.

    Members killed by ``stop()`` are orphans, reaped by PID 1 (or a subreaper) on its own schedule, which
    this process cannot await; on the test VM PID 1 reaps every ~2 s. So this polls, bounded.
    """
    async with asyncio.timeout(REAP_WAIT):
        while group_exists(pgid):
            await asyncio.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


async def forker_pids(process: ConnectorProcess) -> dict[int, float]:
    """The (child, intermediate, escapee) pids forker.py printed, with their start times."""
    async with asyncio.timeout(WAIT):
        line = await process.wait_for_stderr(lambda line: line.startswith("forker pids:"))
    assert line is not None
    pids = [int(pid) for pid in line.split(":")[1].split()]
    return {pid: psutil.Process(pid).create_time() for pid in pids}


def mcp_errors(exc: BaseException) -> list[MCPError]:
    """The MCPErrors in an exception, unwrapping the ExceptionGroups the SDK's task groups raise."""
    if isinstance(exc, MCPError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in mcp_errors(sub)]
    return []


async def test_a_connector_answers_initialize_list_and_call_over_the_transport() -> None:
    async with connector("echo_server.py") as process:
        assert process.state is ProcessState.RUNNING
        assert process.pid is not None and process.pgid == process.pid
        assert os.getpgid(process.pid) == process.pid  # its own group, not ours
        async with session(process) as client:
            tools = await client.list_tools()
            assert {"echo", "crash", "sleep"} <= {tool.name for tool in tools.tools}
            assert await call_text(client, "echo", text="hello") == "hello"
    assert process.state is ProcessState.EXITED
    assert process.exited.is_set()
    assert process.exit_reason == "stopped"
    assert process.returncode == 0  # it left on stdin EOF, within the grace period
    assert "echo-fixture: ready" in process.stderr_tail
    assert not group_exists(process.pid)


async def test_a_crash_mid_call_fails_the_call_at_once_and_reports_the_exit_code() -> None:
    async with connector("echo_server.py") as process, session(process) as client:
        pgid = process.pgid
        assert pgid is not None
        with pytest.raises(MCPError) as failure:
            async with asyncio.timeout(WAIT):  # without the transport closing, this would wait forever
                await client.call_tool("crash", {})
        assert failure.value.code == CONNECTION_CLOSED
        async with asyncio.timeout(WAIT):
            await process.exited.wait()
        assert process.exit_reason == "exited with code 3"
        assert process.returncode == 3
        assert process.state is ProcessState.EXITED
        with pytest.raises(MCPError) as later:
            async with asyncio.timeout(WAIT):
                await client.call_tool("echo", {"text": "anyone?"})
        assert later.value.code == CONNECTION_CLOSED
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


async def test_stopping_fails_an_in_flight_call_at_once() -> None:
    async with connector("echo_server.py") as process, session(process) as client:
        call = asyncio.create_task(client.call_tool("sleep", {"seconds": 300}))
        async with asyncio.timeout(WAIT):
            assert await process.wait_for_stderr(lambda line: line == "sleep: 300")
        async with asyncio.timeout(STOP_BOUND):
            await process.stop()
        done, _ = await asyncio.wait({call}, timeout=WAIT)
        assert call in done
        exc = call.exception()
        assert isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED
        assert process.exit_reason == "stopped"


async def test_a_line_over_the_limit_kills_only_that_connector() -> None:
    async with connector("echo_server.py") as neighbour, session(neighbour) as client:
        async with connector("flood.py") as flood:
            with pytest.raises(BaseException) as failure:  # the SDK wraps it in an ExceptionGroup
                async with session(flood):
                    pass
            assert [e.code for e in mcp_errors(failure.value)] == [CONNECTION_CLOSED]
            async with asyncio.timeout(WAIT):
                await flood.exited.wait()
            assert flood.exit_reason == f"line over {ProcessLimits().max_line_bytes} bytes"
            assert flood.state is ProcessState.EXITED
        # The daemon side carries on: the other connector still answers.
        assert neighbour.state is ProcessState.RUNNING
        assert await call_text(client, "echo", text="still here") == "still here"


async def test_a_non_json_stdout_line_is_skipped_and_the_session_goes_on() -> None:
    script = (
        "import runpy, sys\n"
        "print('this is not JSON-RPC', flush=True)\n"
        f"sys.argv = [{str(FIXTURES / 'echo_server.py')!r}]\n"
        f"sys.path.insert(0, {str(FIXTURES)!r})\n"  # as for the script itself: its folder first
        f"runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    process = ConnectorProcess([sys.executable, "-c", script], env=BASE_ENV, cwd=None, name="noisy")
    async with process, session(process) as client:
        assert await call_text(client, "echo", text="ok") == "ok"
        assert process.state is ProcessState.RUNNING


async def test_stop_escalates_to_sigkill_when_the_connector_ignores_eof_and_sigterm() -> None:
    async with connector("hang.py") as process:
        async with asyncio.timeout(WAIT):
            assert await process.wait_for_stderr(lambda line: line == "hang: ready")

        async def initialize() -> None:
            async with Client(process.transport(), mode="legacy"):
                pass

        pending = asyncio.create_task(initialize())  # an initialize that will never be answered
        async with asyncio.timeout(STOP_BOUND):  # the documented bound, as a fail-safe
            await process.stop()
        assert process.returncode == -signal.SIGKILL
        assert process.exit_reason == "stopped"
        assert process.state is ProcessState.EXITED
        done, _ = await asyncio.wait({pending}, timeout=WAIT)
        assert pending in done
        exc = pending.exception()
        assert exc is not None and [e.code for e in mcp_errors(exc)] == [CONNECTION_CLOSED]
    assert not group_exists(process.pid or 0)


async def test_stop_leaves_no_process_of_the_tree_alive() -> None:
    async with connector("forker.py") as process:
        pgid = process.pgid
        assert pgid is not None
        created = await forker_pids(process)
        child, intermediate, escapee = created
        assert os.getpgid(child) == os.getpgid(intermediate) == pgid
        assert os.getpgid(escapee) != pgid  # setsid: killpg cannot reach it
        async with session(process) as client:
            assert await client.list_tools()

        async with asyncio.timeout(STOP_BOUND):
            await process.stop()

        survivors = [pid for pid, at in created.items() if is_alive(pid, at)]
        assert not survivors, f"still running after stop(): {survivors}"
    await assert_group_gone(pgid)
    assert not any(is_alive(pid, at) for pid, at in created.items())


async def test_a_crash_whose_children_hold_the_pipes_still_fails_fast_and_kills_the_tree() -> None:
    async with connector("forker.py") as process, session(process) as client:
        pgid = process.pgid
        assert pgid is not None
        created = await forker_pids(process)
        with pytest.raises(MCPError) as failure:
            async with asyncio.timeout(WAIT):  # stdout never reaches EOF by itself here: the children hold it
                await client.call_tool("crash", {})
        assert failure.value.code == CONNECTION_CLOSED
        async with asyncio.timeout(WAIT):
            await process.exited.wait()
        assert process.exit_reason == "exited with code 3"
        assert not [pid for pid, at in created.items() if is_alive(pid, at)]
    await assert_group_gone(pgid)


async def test_an_escapee_orphaned_after_a_snapshot_is_still_killed() -> None:
    async with connector("forker.py") as process, session(process) as client:
        pids = json.loads(await call_text(client, "orphan"))
        escapee, intermediate = pids["escapee"], pids["intermediate"]
        created = psutil.Process(escapee).create_time()
        assert escapee in process.snapshot_descendants()

        assert await call_text(client, "release") == "released"
        # Now nothing in /proc links it to the connector: not its group, session or ancestry.
        assert psutil.Process(escapee).ppid() != intermediate
        assert os.getsid(escapee) != process.pid

        async with asyncio.timeout(STOP_BOUND):
            await process.stop()
        assert not is_alive(escapee, created)


async def test_the_connector_gets_exactly_the_environment_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_CONTROL_TOKEN", "secret-of-the-daemon")
    monkeypatch.setenv("HOME", "/home/daemon-user")
    env = {**BASE_ENV, "CONNECTOR_SETTING": "1"}
    async with connector("echo_server.py", env=env) as process, session(process) as client:
        keys = json.loads(await call_text(client, "env_keys"))
    assert keys == sorted(env)


async def test_argv_is_passed_verbatim_without_a_shell() -> None:
    args = ["two words", 'double "quoted"', "it's", "$HOME", "*", "a;b | c", "`id`", "", "ünï"]
    async with connector("echo_server.py", *args) as process, session(process) as client:
        assert json.loads(await call_text(client, "argv")) == args


async def test_stderr_is_kept_as_a_bounded_tail() -> None:
    script = "import sys\nfor i in range(5000): print(i, file=sys.stderr)\nprint('x' * 100000, file=sys.stderr)\n"
    process = ConnectorProcess(
        [sys.executable, "-c", script], env=BASE_ENV, cwd=None, limits=ProcessLimits(stderr_lines=3)
    )
    async with process:
        async with asyncio.timeout(WAIT):
            await process.exited.wait()
        assert process.exit_reason == "exited with code 0"
        tail = process.stderr_tail
        assert tail[:2] == ["4998", "4999"]
        assert len(tail) == 3
        assert tail[2].startswith("xxxx") and tail[2].endswith("[cut]") and len(tail[2]) < 5000


async def test_a_program_that_cannot_start_ends_in_exited_with_the_reason() -> None:
    process = ConnectorProcess(["/nonexistent/connector"], env=BASE_ENV, cwd=None)
    with pytest.raises(FileNotFoundError):
        await process.__aenter__()
    assert process.state is ProcessState.EXITED
    assert process.exited.is_set()
    assert process.exit_reason is not None and process.exit_reason.startswith("failed to start: FileNotFoundError")


async def test_illegal_transitions_raise_naming_both_states() -> None:
    process = connector("echo_server.py")
    with pytest.raises(ProcessStateError, match="transport"):
        process.transport()
    async with process:
        with pytest.raises(ProcessStateError, match="running -> running"):
            await process.__aenter__()
    assert process.state is ProcessState.EXITED
    with pytest.raises(ProcessStateError, match="exited -> running"):
        await process.__aenter__()
    await process.stop()  # stopping twice is fine


async def test_stop_before_start_needs_no_process() -> None:
    process = connector("echo_server.py")
    await process.stop()
    assert process.state is ProcessState.EXITED
    assert process.exit_reason == "stopped"
    assert process.exited.is_set()


async def test_a_stop_during_the_spawn_leaves_no_process() -> None:
    process = connector("echo_server.py")
    starting = asyncio.create_task(process.__aenter__())
    await asyncio.sleep(0)  # let the spawn begin (if it has not, __aenter__ refuses to start at all)
    await process.stop()
    assert process.state is ProcessState.EXITED
    done, _ = await asyncio.wait({starting}, timeout=WAIT)
    assert starting in done
    assert isinstance(starting.exception(), ProcessStateError)
    if process.pid is not None:  # it had forked: the process was killed and reaped
        assert process.returncode is not None
        assert not group_exists(process.pid)


async def test_a_cancelled_stop_still_finishes_the_teardown() -> None:
    async with connector("echo_server.py") as process:
        stopping = asyncio.create_task(process.stop())
        async with asyncio.timeout(WAIT):
            while process.state is not ProcessState.STOPPING:
                await asyncio.sleep(0)
        stopping.cancel()
        done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND)
        assert stopping in done and stopping.cancelled()
        assert process.state is ProcessState.EXITED  # the cancel landed only after the teardown
        assert process.returncode is not None


async def cancel_every_other_task() -> list[asyncio.Task[object]]:
    """What ``asyncio.run()`` does on its way out: cancel every other task, then wait for them all."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    async with asyncio.timeout(STOP_BOUND):
        await asyncio.gather(*others, return_exceptions=True)
    return others


async def test_an_event_loop_teardown_cannot_cut_a_stop_short() -> None:
    async with connector("hang.py") as process:
        async with asyncio.timeout(WAIT):
            assert await process.wait_for_stderr(lambda line: line == "hang: ready")
        stopping = asyncio.create_task(process.stop())
        async with asyncio.timeout(WAIT):  # the stop is under way: it closed stdin and waits out the grace
            assert await process.wait_for_stderr(lambda line: line == "hang: stdin closed")
        await cancel_every_other_task()
        assert stopping.cancelled()
        assert process.state is ProcessState.EXITED
        assert process.returncode == -signal.SIGKILL  # escalated to the end, the exit observed


async def test_a_stop_cancelled_before_it_began_still_kills_the_connector() -> None:
    async with connector("echo_server.py") as process:
        pid = process.pid
        assert pid is not None
        created = psutil.Process(pid).create_time()
        stopping = asyncio.create_task(process.stop())
        async with asyncio.timeout(WAIT):
            while process.state is not ProcessState.STOPPING:
                await asyncio.sleep(0)
        await cancel_every_other_task()  # the stop's own task never ran a step
        assert stopping.cancelled()
        assert process.state is ProcessState.EXITED
        assert process.exited.is_set()
    await assert_group_gone(pid)  # SIGKILLed synchronously; the kernel and the reaper finish on their own time
    assert not is_alive(pid, created)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        ProcessLimits(max_line_bytes=0)


# --- failed or stopped: how it ended decides whether `connectors show` reports it ------------------------


async def test_a_stopped_connector_has_not_failed_and_a_crashed_one_has() -> None:
    async with connector("echo_server.py") as stopped:
        pass
    assert stopped.exit_reason == "stopped" and not stopped.failed
    async with connector("echo_server.py") as crashed, session(crashed) as client:
        with pytest.raises(MCPError):
            async with asyncio.timeout(WAIT):
                await client.call_tool("crash", {})
        async with asyncio.timeout(WAIT):
            await crashed.exited.wait()
    assert crashed.exit_reason == "exited with code 3" and crashed.failed
    unstartable = ConnectorProcess(["/nonexistent/connector"], env=BASE_ENV, cwd=None)
    with pytest.raises(FileNotFoundError):
        await unstartable.__aenter__()
    assert unstartable.failed


async def test_a_stop_that_comes_after_the_connector_ended_its_output_names_the_exit_code() -> None:
    # It closes stdout, then exits with 5 a little later: a stop in between (as when a session fails on the
    # EOF) must not pass its exit off as "stopped".
    script = "import os, sys, time\nos.close(1)\ntime.sleep(0.5)\nsys.exit(5)\n"
    process = ConnectorProcess([sys.executable, "-c", script], env=BASE_ENV, cwd=None)
    async with process:
        async with asyncio.timeout(WAIT), process.transport() as (read, _):
            with pytest.raises(anyio.EndOfStream):
                await read.receive()
        assert process.returncode is None
        async with asyncio.timeout(STOP_BOUND):
            await process.stop()
    assert process.exit_reason == "exited with code 5" and process.failed


async def test_a_stop_that_comes_after_the_exit_but_before_its_code_is_collected_names_the_code() -> None:
    process = ConnectorProcess([sys.executable, "-c", "import sys; sys.exit(4)"], env=BASE_ENV, cwd=None)
    async with process:
        pid = process.pid
        assert pid is not None
        # Hold the event loop (on purpose, bounded) until the child is gone or a zombie: asyncio cannot collect
        # its exit code meanwhile, so stop() finds it exited without a code.
        deadline = time.monotonic() + WAIT
        while pid_alive(pid):
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.005)
        assert process.returncode is None
        async with asyncio.timeout(STOP_BOUND):
            await process.stop()
    assert process.exit_reason == "exited with code 4" and process.failed
