"""``sidecar exec``: an agent runs with a session of its own, gets its exit code back, and the session ends.

A real daemon subprocess, ``python -m sidecar exec`` as a real subprocess, and agents that are real
programs: a shell, and a script using the MCP SDK's own client with nothing but its environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from tests.conftest import DaemonProcess

pytestmark = pytest.mark.slow  # a daemon subprocess, the CLI and agents as processes

BOUND: Final = 60.0
AGENT: Final = textwrap.dedent(
    """
    import asyncio, os
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> None:
        headers = {
            "Authorization": os.environ["SIDECAR_LOCAL_MCP_AUTHORIZATION"],
            "X-Sidecar-Context": os.environ["SIDECAR_MCP_CONTEXT"],
        }
        url = os.environ["SIDECAR_LOCAL_MCP_ORIGIN"] + "/mcp"
        assert url == os.environ["SIDECAR_MCP_URL"]
        async with httpx2.AsyncClient(headers=headers) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool("calculate", {"expression": "6*7"})
                print("agent got", result.content[0].text)

    asyncio.run(main())
    """
)


def _exec(daemon: DaemonProcess, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "exec", *argv],
        env=daemon.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )


def _sessions(daemon: DaemonProcess) -> str:
    return daemon.cli("session", "list", "--json").stdout


def _audit(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    lines = daemon.paths.audit_file.read_text().splitlines()
    return [record for line in lines if (record := json.loads(line))["event"] == event]


def test_the_agent_gets_the_connection_and_its_exit_code_comes_back(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    project = tmp_path / "my-project"
    project.mkdir()
    done = _exec(daemon_process, "--", "sh", "-c", "env; exit 7", cwd=project)

    assert done.returncode == 7, done.stderr
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    runtime = daemon_process.paths.runtime_file.read_text()
    assert env["SIDECAR_LOCAL_MCP_ORIGIN"].startswith("http://127.0.0.1:")
    assert env["SIDECAR_LOCAL_MCP_ORIGIN"].rsplit(":", 1)[1] in runtime
    assert env["SIDECAR_LOCAL_MCP_AUTHORIZATION"].startswith("Bearer ")
    assert env["SIDECAR_MCP_CONTEXT"].startswith("v1.")
    assert daemon_process.env["SIDECAR_HOME"] == env["SIDECAR_HOME"]  # the rest of the environment passes
    assert _sessions(daemon_process).strip() == "[]", "the agent's session outlived it"
    created = _audit(daemon_process, "session.created")
    assert [(r["project"], r["label"]) for r in created] == [("my-project", "sh")]  # labelled with its command


def test_an_sdk_client_connects_with_only_what_its_environment_holds(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    done = _exec(daemon_process, "--", sys.executable, str(agent), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "agent got 42" in done.stdout
    assert [r["tool"] for r in _audit(daemon_process, "tool.call")] == ["calculate"]
    assert _sessions(daemon_process).strip() == "[]"


def test_a_signal_to_sidecar_exec_reaches_the_agent(daemon_process: DaemonProcess, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f"trap 'exit 42' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; while :; do sleep 0.05; done"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "exec", "--", "sh", "-c", script],
        env=daemon_process.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + BOUND
        while not ready.exists():  # the agent traps TERM only once it has started: poll, bounded
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.05)
        assert _sessions(daemon_process).strip() != "[]"
        os.kill(proc.pid, signal.SIGTERM)  # to sidecar exec alone, as a service manager would
        assert proc.wait(timeout=BOUND) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=BOUND)
        if proc.stderr is not None:
            proc.stderr.close()
        if ready.exists():  # a sidecar exec that died without passing the signal on orphans its agent
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(ready.read_text()), signal.SIGKILL)
    assert _sessions(daemon_process).strip() == "[]"


def test_an_agent_killed_by_a_signal_exits_as_a_shell_reports_it(daemon_process: DaemonProcess, tmp_path: Path) -> None:
    done = _exec(daemon_process, "--", "sh", "-c", "kill -KILL $$", cwd=tmp_path)
    assert done.returncode == 128 + signal.SIGKILL
    assert _sessions(daemon_process).strip() == "[]"


def test_an_agent_that_cannot_start_is_a_clear_error_and_leaves_no_session(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    done = _exec(daemon_process, "--", str(tmp_path / "no-such-agent"), cwd=tmp_path)
    assert done.returncode == 1
    assert "cannot run" in done.stderr and "Traceback" not in done.stderr
    assert _sessions(daemon_process).strip() == "[]"

    missing = _exec(daemon_process, cwd=tmp_path)
    assert missing.returncode == 1 and "sidecar exec -- claude" in missing.stderr


STOPPER: Final = textwrap.dedent(
    """
    import json, os, signal, sys, time, urllib.error, urllib.request

    def status() -> int:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "child", "version": "0"}}}
        request = urllib.request.Request(os.environ["SIDECAR_MCP_URL"], data=json.dumps(body).encode(), headers={
            "Authorization": os.environ["SIDECAR_LOCAL_MCP_AUTHORIZATION"],
            "X-Sidecar-Context": os.environ["SIDECAR_MCP_CONTEXT"],
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    used, using = os.pipe()
    if os.fork() == 0:  # a detached child that keeps the agent's environment, and uses it afterwards
        os.setsid()
        if os.fork() == 0:
            first = status()
            os.write(using, b"1")  # the agent goes on only once its child has used the session
            deadline = time.monotonic() + 5  # issue 21: the session ends within 5 s of the agent
            while (last := status()) == 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            with open(sys.argv[1] + ".tmp", "w") as out:
                json.dump([first, last], out)
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        os._exit(0)
    os.read(used, 1)
    os.kill(os.getppid(), signal.SIGSTOP)  # sidecar exec can no longer end the session when we exit
    """
)


def test_an_agent_that_stops_its_exec_and_exits_loses_its_session(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    agent, report = tmp_path / "agent.py", tmp_path / "child.json"
    agent.write_text(STOPPER)
    exec_process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "exec", "--", sys.executable, str(agent), str(report)],
        env=daemon_process.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        stopped = psutil.Process(exec_process.pid)
        deadline = time.monotonic() + BOUND
        while not report.exists():  # the detached child reports once the session refuses it
            assert time.monotonic() < deadline, "the detached child never reported"
            time.sleep(0.05)
        assert stopped.status() == psutil.STATUS_STOPPED  # sidecar exec never ran again meanwhile
        first, last = json.loads(report.read_text())
        assert first == 200, "the child could not use the session while the agent ran"
        assert last == 403, "the session outlived its agent"
        assert _sessions(daemon_process).strip() == "[]"
        ended = _audit(daemon_process, "session.ended")
        assert len(ended) == 1
    finally:
        exec_process.kill()
        exec_process.wait(timeout=BOUND)


HOST: Final = textwrap.dedent(
    """
    import asyncio, json, os, re, sys
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    def expand(text: str) -> str:  # what a host that reads ${VAR} in its MCP config does
        return re.sub(r"\\$\\{([A-Z_]+)\\}", lambda m: os.environ[m.group(1)], text)

    async def main() -> None:
        entry = json.load(open(sys.argv[1]))["mcpServers"]["sidecar"]
        headers = {name: expand(value) for name, value in entry["headers"].items()}
        async with httpx2.AsyncClient(headers=headers) as http:
            async with Client(streamable_http_client(expand(entry["url"]), http_client=http)) as client:
                result = await client.call_tool("calculate", {"expression": "2**5"})
                print("host got", result.content[0].text)

    asyncio.run(main())
    """
)


def test_a_committed_config_with_env_refs_works_under_sidecar_exec(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    template = daemon_process.cli("session", "new", "--format", "claude-code", "--env-refs").stdout
    assert "Bearer" not in template and "v1." not in template  # nothing secret: it may be committed
    assert _sessions(daemon_process).strip() == "[]"  # and no session was made for it
    (tmp_path / ".mcp.json").write_text(template)
    host = tmp_path / "host.py"
    host.write_text(HOST)

    done = _exec(daemon_process, "--", sys.executable, str(host), str(tmp_path / ".mcp.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "host got 32" in done.stdout
    assert _sessions(daemon_process).strip() == "[]"
