"""The ``sidecar`` command line against a real daemon subprocess (``python -m sidecar serve --port 0``).

What a test is about goes through the CLI exactly as a user types it, and the MCP side through the SDK's
own client (set-up that is not the point of a test may call the control API directly). Every wait is
bounded (the bounds are fail-safes, never timing assertions). One CLI run costs ~1.3 s of CPU (the control
client imports the whole daemon, MCP SDK included), so independent runs go concurrently (``cli_all``) and
each test reuses one daemon.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from sidecar import __version__
from sidecar.paths import Paths
from tests.conftest import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    DaemonProcess,
    mcp_client,
    sidecar_env,
    start_daemon_process,
    stop_daemon_process,
)
from tests.helpers import control_request, initialize_request, request_json, tool_text

CLI_TIMEOUT = 30.0
"""Fail-safe bound on one CLI run (a hung command fails the test instead of hanging it)."""
HTTP_TIMEOUT = 10.0
MCP_TIMEOUT = 20.0
RUNTIME_KEYS = {"pid", "url", "port", "control_token", "started_at", "version"}
ERAS = ("legacy", "auto")
FORMATS = ["raw", "claude-code", "cursor", "vscode", "claude-desktop"]
NOT_RUNNING = "no sidecar daemon is running"


# --- helpers ---------------------------------------------------------------------------------------------


def cli_all(
    env: dict[str, str], *argvs: list[str], envs: list[dict[str, str]] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Run several ``python -m sidecar ...`` concurrently (``envs``: one env each); all bounded and reaped."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sidecar", *argv],
            env=env_,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv, env_ in zip(argvs, envs or [env] * len(argvs), strict=True)
    ]
    results: list[subprocess.CompletedProcess[str]] = []
    try:
        for proc, argv in zip(procs, argvs, strict=True):
            out, err = proc.communicate(timeout=CLI_TIMEOUT)
            results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=5)
    return results


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return cli_all(env, list(argv))[0]


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def failed(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """Assert a clean failure (exit ``code``, no traceback) and return its combined output."""
    assert result.returncode == code, (result.args, result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    return result.stdout + result.stderr


def runtime_of(d: DaemonProcess) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(d.paths.runtime_file.read_text())
    return data


def session_new(d: DaemonProcess, workspace: Path, *extra: str) -> dict[str, Any]:
    """``sidecar session new --format raw ...`` → the raw config."""
    result = ok(d.cli("session", "new", "--workspace", str(workspace), "--format", "raw", *extra, timeout=CLI_TIMEOUT))
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """The daemon's exit code; fails (rather than hangs) if it does not exit within the fail-safe bound."""
    try:
        return proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"daemon pid {proc.pid} did not exit within {STOP_TIMEOUT}s")


async def post_mcp(raw: dict[str, Any]) -> tuple[int, dict[str, str]]:
    """POST an ``initialize`` to /mcp with a raw config's headers; (status, headers)."""
    headers = {**raw["headers"], "Accept": "application/json, text/event-stream"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            raw["url"],
            json=initialize_request("test-cli"),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT),
        ) as response,
    ):
        await response.read()
        return response.status, dict(response.headers)


async def control(d: DaemonProcess, method: str, path: str, body: Any = None) -> Any:
    """The control API directly (for set-up that is not what a test is about)."""
    runtime = runtime_of(d)
    status, data = await control_request(runtime["url"], runtime["control_token"], method, path, body)
    assert status < 300, data
    return data


async def tool_names(raw: dict[str, Any], mode: str = "legacy") -> list[str]:
    async def go() -> list[str]:
        async with mcp_client(raw, mode=mode) as client:
            listed = await client.list_tools()
            return sorted(t.name for t in listed.tools)

    return await asyncio.wait_for(go(), MCP_TIMEOUT)


async def calculate(raw: dict[str, Any], expression: str, mode: str = "legacy") -> Any:
    async def go() -> Any:
        async with mcp_client(raw, mode=mode) as client:
            return await client.call_tool("calculate", {"expression": expression})

    return await asyncio.wait_for(go(), MCP_TIMEOUT)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait(CLI_TIMEOUT)
    return proc.pid


def write_config(home: Path, text: str) -> Path:
    config = home / "config"
    config.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = config / "sidecar.toml"
    path.write_text(text)
    return path


@pytest.fixture
def d(daemon_process: DaemonProcess) -> DaemonProcess:
    return daemon_process


@pytest.fixture
def spawned() -> Iterator[list[DaemonProcess]]:
    """Daemons a test starts itself; stopped (bounded) however the test ends."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        stop_daemon_process(daemon)


# --- 1. serve / status / stop ----------------------------------------------------------------------------


async def test_serve_writes_runtime_status_reports_and_stop_stops(d: DaemonProcess, workspace: Path) -> None:
    runtime_file = d.paths.runtime_file
    assert stat.S_IMODE(runtime_file.stat().st_mode) == 0o600
    runtime = runtime_of(d)
    assert set(runtime) == RUNTIME_KEYS
    assert runtime["pid"] == d.proc.pid
    assert isinstance(runtime["port"], int) and runtime["port"] > 0
    assert runtime["url"] == f"http://127.0.0.1:{runtime['port']}"
    assert runtime["version"] == __version__
    assert isinstance(runtime["control_token"], str) and len(runtime["control_token"]) >= 43
    assert isinstance(runtime["started_at"], int | float)

    assert await request_json("GET", runtime["url"] + "/healthz") == (200, {"status": "ok"})

    await control(d, "POST", "/control/sessions", {"workspace": str(workspace)})  # one live session
    text, as_json = (ok(r).stdout for r in cli_all(d.env, ["status"], ["status", "--json"]))
    assert __version__ in text and runtime["url"] in text and str(d.proc.pid) in text
    assert re.search(r"sessions:\s+1\b", text), text
    assert re.search(r"peers:\s+other OS accounts refused at accept; 0 connections refused", text), text
    status = json.loads(as_json)
    assert status["version"] == __version__
    assert status["pid"] == d.proc.pid
    assert status["url"].startswith(runtime["url"])
    assert status["sessions"] == 1
    assert status["peer_check"]["checked"] is True and status["peer_check"]["refused"] == 0
    assert runtime["control_token"] not in text + as_json

    stopped = ok(d.cli("stop", timeout=CLI_TIMEOUT))
    assert str(d.proc.pid) in stopped.stdout
    assert wait_exit(d.proc) == 0
    assert not runtime_file.exists()


# --- 2. signals --------------------------------------------------------------------------------------------


def spawn_serve(home: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--port", "0"],
        env=sidecar_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_while_serving_stops_gracefully(
    home: Path, workspace: Path, signum: int, spawned: list[DaemonProcess]
) -> None:
    daemon = start_daemon_process(home)
    spawned.append(daemon)
    raw = await control(daemon, "POST", "/control/sessions", {"workspace": str(workspace)})
    assert await tool_names(raw)  # it has served real MCP traffic

    daemon.proc.send_signal(signum)
    assert wait_exit(daemon.proc) == 0
    assert not daemon.paths.runtime_file.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_right_after_runtime_json_appears_is_graceful(home: Path, signum: int) -> None:
    """runtime.json is the readiness signal (service managers, scripts): a stop right after it is clean.

    Regression: runtime.json used to be written before the signal handlers were installed, so a signal in
    that window killed the daemon (SIGTERM: exit -15, runtime.json left behind; SIGINT: exit 130). One
    attempt caught it about two times in three.
    """
    runtime_file = Paths.resolve(sidecar_env(home)).runtime_file
    proc = spawn_serve(home)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not runtime_file.exists():  # spin (no sleep): signal the moment the file is there
            assert proc.poll() is None and time.monotonic() < deadline, "daemon did not start"
        proc.send_signal(signum)
        assert (wait_exit(proc), runtime_file.exists()) == (0, False), "(exit code, runtime.json left)"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


# --- 3. one daemon per home ------------------------------------------------------------------------------


async def test_second_serve_refuses_while_the_first_lives(d: DaemonProcess) -> None:
    before = d.paths.runtime_file.read_bytes()
    runtime = runtime_of(d)
    second = cli(d.env, "serve", "--port", "0")
    message = failed(second)
    assert str(d.proc.pid) in message and runtime["url"] in message
    assert "already running" in message

    assert d.proc.poll() is None
    assert d.paths.runtime_file.read_bytes() == before
    assert await request_json("GET", runtime["url"] + "/healthz") == (200, {"status": "ok"})
    assert (await control(d, "GET", "/control/status"))["pid"] == d.proc.pid


async def test_stale_runtime_file_is_replaced(home: Path, spawned: list[DaemonProcess]) -> None:
    paths = Paths.resolve(sidecar_env(home))
    paths.state.mkdir(mode=0o700, parents=True)
    stale = {
        "pid": dead_pid(),
        "url": "http://127.0.0.1:1",
        "port": 1,
        "control_token": "stale-token",
        "started_at": 1.0,
        "version": "0.0.0",
    }
    paths.runtime_file.write_text(json.dumps(stale))
    paths.runtime_file.chmod(0o600)

    daemon = start_daemon_process(home)  # returns once runtime.json names the new pid
    spawned.append(daemon)
    runtime = runtime_of(daemon)
    assert runtime["pid"] == daemon.proc.pid != stale["pid"]
    assert runtime["control_token"] != "stale-token" and runtime["port"] != 1
    assert await request_json("GET", runtime["url"] + "/healthz") == (200, {"status": "ok"})


# --- 4. bind address and configuration ------------------------------------------------------------------


def test_non_loopback_hosts_are_refused_and_nothing_binds(home: Path) -> None:
    env = sidecar_env(home)
    hosts = ["0.0.0.0", "::1", "192.168.1.1"]
    results = cli_all(env, *(["serve", "--port", "0", "--host", host] for host in hosts))
    for host, result in zip(hosts, results, strict=True):
        message = failed(result)
        assert "127.0.0.1" in message and host in message, message
    assert not Paths.resolve(env).state.exists()  # no daemon ever started: no lock, no runtime.json


BAD_CONFIGS = {
    "port-not-int": ('port = "x"\n', "port"),
    "depth-too-small": ("[limits]\nmax_json_depth = 1\n", "limits.max_json_depth"),
    "host-not-loopback": ('host = "0.0.0.0"\n', "host"),
}


def test_invalid_config_file_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    cases = []
    for name, (toml, field) in BAD_CONFIGS.items():
        home = tmp_path / name
        cases.append((home, write_config(home, toml), field))
    # no --port: it would override the file's port
    results = cli_all(sidecar_env(tmp_path), *(["serve"] for _ in cases), envs=[sidecar_env(h) for h, _, _ in cases])
    for (home, settings, field), result in zip(cases, results, strict=True):
        message = failed(result)
        assert str(settings) in message and field in message, message
        assert not Paths.resolve(sidecar_env(home)).runtime_file.exists()


def test_invalid_sidecar_port_env_is_refused_naming_the_variable(tmp_path: Path) -> None:
    """The bad value is blamed on SIDECAR_PORT, not on a settings file (with or without one)."""
    bare = {**sidecar_env(tmp_path / "bare"), "SIDECAR_PORT": "x"}
    settings = write_config(tmp_path / "with-file", "[limits]\nmax_json_depth = 1\n")
    with_file = {**sidecar_env(tmp_path / "with-file"), "SIDECAR_PORT": "x"}
    bare_result, file_result = cli_all(bare, ["serve"], ["serve"], envs=[bare, with_file])
    message = failed(bare_result)
    assert "SIDECAR_PORT" in message and "port" in message, message
    message = failed(file_result)
    assert re.search(r"SIDECAR_PORT: port\b", message), message
    assert re.search(rf"{re.escape(str(settings))}: limits\.max_json_depth\b", message), message


# --- 5. session new, every host format, and the raw one through the SDK ---------------------------------


def _assert_http_headers(headers: dict[str, str]) -> None:
    assert set(headers) == {"Authorization", "X-Sidecar-Context"}
    assert headers["Authorization"].startswith("Bearer ") and " " not in headers["Authorization"][7:]
    assert headers["X-Sidecar-Context"].startswith("v1.")


async def test_session_new_prints_each_host_config_and_raw_works_with_the_sdk(
    d: DaemonProcess, workspace: Path
) -> None:
    mcp_url = runtime_of(d)["url"] + "/mcp"
    spec = ["--workspace", str(workspace), "--project", "p1", "--mode", "read-only", "--allow", "calculate"]
    # (raw also with --json: scripts pass it to every data command; the output is the same JSON)
    results = cli_all(
        d.env, *(["session", "new", *spec, "--format", fmt, *(["--json"] if fmt == "raw" else [])] for fmt in FORMATS)
    )
    out = {fmt: json.loads(ok(result).stdout) for fmt, result in zip(FORMATS, results, strict=True)}

    raw = out["raw"]
    assert set(raw) == {"session_id", "url", "headers", "expires_at"}
    assert raw["url"] == mcp_url
    assert raw["session_id"].startswith("s_")
    assert isinstance(raw["expires_at"], int) and raw["expires_at"] > time.time()
    _assert_http_headers(raw["headers"])

    claude_code = out["claude-code"]
    assert list(claude_code) == ["mcpServers"] and list(claude_code["mcpServers"]) == ["sidecar"]
    entry = claude_code["mcpServers"]["sidecar"]
    assert set(entry) == {"type", "url", "headers"} and entry["type"] == "http" and entry["url"] == mcp_url
    _assert_http_headers(entry["headers"])

    cursor = out["cursor"]
    assert list(cursor) == ["mcpServers"] and list(cursor["mcpServers"]) == ["sidecar"]
    entry = cursor["mcpServers"]["sidecar"]
    assert set(entry) == {"url", "headers"} and entry["url"] == mcp_url
    _assert_http_headers(entry["headers"])

    vscode = out["vscode"]
    assert list(vscode) == ["servers"] and list(vscode["servers"]) == ["sidecar"]
    entry = vscode["servers"]["sidecar"]
    assert set(entry) == {"type", "url", "headers"} and entry["type"] == "http" and entry["url"] == mcp_url
    _assert_http_headers(entry["headers"])

    desktop = out["claude-desktop"]
    assert list(desktop) == ["mcpServers"] and list(desktop["mcpServers"]) == ["sidecar"]
    entry = desktop["mcpServers"]["sidecar"]
    assert entry["command"] == "npx"
    args, env = entry["args"], entry["env"]
    assert "mcp-remote" in args and mcp_url in args
    header_values = [args[i + 1] for i, arg in enumerate(args) if arg == "--header"]
    assert len(header_values) == 2
    expanded: dict[str, str] = {}
    for value in header_values:
        assert " " not in value, value  # mcp-remote splits arguments on spaces
        name, _, ref = value.partition(":")
        var = re.fullmatch(r"\$\{([A-Z_][A-Z0-9_]*)\}", ref)
        assert var is not None and var.group(1) in env, (value, env)
        expanded[name] = env[var.group(1)]
    _assert_http_headers(expanded)
    assert any(v.startswith("Bearer ") for v in env.values())
    assert any(v.startswith("v1.") for v in env.values())
    assert not any(arg.startswith("Bearer") or arg.startswith("v1.") for arg in args)  # secrets only in env

    # The raw output, used as is by the SDK client in both protocol eras: only the --allow'ed tool is
    # there, and it runs.
    for mode in ERAS:
        assert await tool_names(raw, mode) == ["calculate"], mode
        result = await calculate(raw, "6 * 7", mode)
        assert not result.is_error and result.structured_content == {"result": 42}, mode

    # The headers every http host config carries work the same way.
    for fmt, servers in (("claude-code", "mcpServers"), ("cursor", "mcpServers"), ("vscode", "servers")):
        entry = out[fmt][servers]["sidecar"]
        assert await tool_names({"url": entry["url"], "headers": entry["headers"]}) == ["calculate"], fmt


# --- 6. session list / end / update ---------------------------------------------------------------------


async def test_session_list_end_and_update(d: DaemonProcess, workspace: Path) -> None:
    spec = ["session", "new", "--workspace", str(workspace), "--allow", "calculate"]
    first, second = (
        json.loads(ok(r).stdout)
        for r in cli_all(d.env, [*spec, "--project", "p1", "--mode", "read-only"], [*spec, "--project", "p2"])
    )
    assert await tool_names(first) == ["calculate"]

    # end: the same headers stop working at once (the SDK client fails; the wire says 403)
    ended = json.loads(ok(d.cli("session", "end", first["session_id"], "--json", timeout=CLI_TIMEOUT)).stdout)
    assert ended["ended"] is True
    with pytest.raises((MCPError, ExceptionGroup, httpx2.HTTPStatusError)):
        await tool_names(first)
    status, _ = await post_mcp(first)
    assert status == 403

    # list: the live session is there, the ended one is not, and no credential is ever printed
    text, as_json = (ok(r).stdout for r in cli_all(d.env, ["session", "list"], ["session", "list", "--json"]))
    assert second["session_id"] in text and "p2" in text and first["session_id"] not in text
    listed = json.loads(as_json)
    assert [s["session_id"] for s in listed] == [second["session_id"]]
    assert listed[0]["project_id"] == "p2"
    assert listed[0]["mode"] == "default"
    assert listed[0]["allow"] == ["calculate"]
    assert listed[0]["workspace"] == str(workspace.resolve())
    secrets = [
        second["headers"]["Authorization"].removeprefix("Bearer "),
        second["headers"]["X-Sidecar-Context"],
        second["headers"]["X-Sidecar-Context"].split(".")[-1],
        runtime_of(d)["control_token"],
    ]
    for secret in secrets:
        assert secret not in text and secret not in as_json
    assert "Bearer" not in text + as_json

    # update: the grant changes what an open client may call and what a new listing shows
    async with mcp_client(second) as client:
        listed_before = await asyncio.wait_for(client.list_tools(), MCP_TIMEOUT)
        assert [t.name for t in listed_before.tools] == ["calculate"]
        updated = await asyncio.to_thread(
            d.cli,
            "session",
            "update",
            second["session_id"],
            "--allow",
            "get_current_time",
            "--json",
            timeout=CLI_TIMEOUT,
        )
        assert json.loads(ok(updated).stdout)["allow"] == ["get_current_time"]
        refused = await asyncio.wait_for(client.call_tool("calculate", {"expression": "1+1"}), MCP_TIMEOUT)
        assert refused.is_error
    for mode in ERAS:
        assert await tool_names(second, mode) == ["get_current_time"], mode


async def test_sessions_say_what_they_are_label_client_and_last_use(d: DaemonProcess, workspace: Path) -> None:
    spec = ["session", "new", "--workspace", str(workspace)]
    hosted, labelled, raw = (
        json.loads(ok(r).stdout)
        for r in cli_all(d.env, [*spec, "--format", "raw", "--label", "review bot"], [*spec], [*spec])
    )
    made = json.loads(ok(d.cli(*spec, "--format", "claude-code", timeout=CLI_TIMEOUT)).stdout)
    assert "mcpServers" in made  # a host's config: its session is labelled with the host
    refused = d.cli(*spec, "--label", "two\nlines", check=False, timeout=CLI_TIMEOUT)
    assert refused.returncode == 1 and "label must be" in refused.stderr

    # A client that initializes names itself; each request marks the session used.
    async with mcp_client(hosted) as client:
        await asyncio.wait_for(client.list_tools(), MCP_TIMEOUT)
    listed = {s["session_id"]: s for s in json.loads(ok(d.cli("session", "list", "--json")).stdout)}
    assert [s["label"] for s in listed.values()].count("claude-code") == 1
    used = listed[hosted["session_id"]]
    assert used["label"] == "review bot" and used["client"] is not None and used["client"].startswith("mcp ")
    assert used["last_used_at"] is not None and used["last_used_at"] >= used["created_at"]
    idle = listed[labelled["session_id"]]
    assert (idle["label"], idle["client"], idle["last_used_at"]) == ("", None, None)

    text = ok(d.cli("session", "list", timeout=CLI_TIMEOUT)).stdout
    row = next(line for line in text.splitlines() if hosted["session_id"] in line)
    assert "review bot" in row and "mcp " in row and "s ago" in row
    assert text.splitlines()[0].split()[:4] == ["ID", "LABEL", "CLIENT", "MODE"]
    status = json.loads(ok(d.cli("status", "--json", timeout=CLI_TIMEOUT)).stdout)
    assert status["recent_sessions"][0]["session_id"] == hosted["session_id"]
    assert "last used: review bot, mcp " in ok(d.cli("status", timeout=CLI_TIMEOUT)).stdout
    assert raw["session_id"] in listed


# --- 7. routes -----------------------------------------------------------------------------------------


async def test_routes_list_and_rotate(d: DaemonProcess, workspace: Path) -> None:
    new_session = ["session", "new", "--workspace", str(workspace), "--allow", "calculate"]
    created, text, as_json = (
        ok(r).stdout for r in cli_all(d.env, new_session, ["routes", "list"], ["routes", "list", "--json"])
    )
    old = json.loads(created)
    assert re.search(r"^connector-proxy\s+/mcp\s*$", text, re.MULTILINE), text
    assert {"name": "connector-proxy", "path": "/mcp"}.items() <= json.loads(as_json)[0].items()
    assert old["headers"]["Authorization"].removeprefix("Bearer ") not in text + as_json
    assert (await post_mcp(old))[0] == 200

    ok(d.cli("routes", "rotate", "connector-proxy", timeout=CLI_TIMEOUT))
    status, headers = await post_mcp(old)
    assert status == 401
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")

    new = session_new(d, workspace, "--allow", "calculate")
    assert new["headers"]["Authorization"] != old["headers"]["Authorization"]
    result = await calculate(new, "2 ** 10")
    assert not result.is_error and result.structured_content == {"result": 1024}


# --- 8. audit ------------------------------------------------------------------------------------------


async def test_audit_records_activity_without_secrets_and_verify_detects_an_edit(
    d: DaemonProcess, workspace: Path
) -> None:
    raw = session_new(d, workspace, "--mode", "read-only", "--allow", "calculate")
    result = await calculate(raw, "40 + 2")
    assert not result.is_error
    token = raw["headers"]["Authorization"].removeprefix("Bearer ")
    envelope = raw["headers"]["X-Sidecar-Context"]
    control_token = runtime_of(d)["control_token"]

    verified, printed, readable = cli_all(d.env, ["audit", "--verify"], ["audit", "--json"], ["audit"])
    assert "ok" in ok(verified).stdout  # (verified while the daemon writes the log)
    records = [json.loads(line) for line in ok(printed).stdout.splitlines() if line.strip()]
    lines = ok(readable).stdout.splitlines()
    assert lines and not any(line.startswith("{") for line in lines)
    assert any(" tool.call " in line and "tool=calculate" in line and "outcome=ok" in line for line in lines)
    events = [r["event"] for r in records]
    assert {"session.created", "token.mint", "tool.call"} <= set(events), events
    call = next(r for r in records if r["event"] == "tool.call")
    assert call["tool"] == "calculate" and call["session"] == raw["session_id"]

    # stop (and wait for the exit), so nothing appends while we read and edit the file
    stop_daemon_process(d)
    assert d.proc.returncode == 0
    log = d.paths.audit_file
    content = log.read_bytes()
    for secret in (token, envelope, envelope.split(".")[-1], control_token):
        assert secret.encode() not in content
    assert b"40 + 2" not in content  # argument values are never audited

    lines = content.splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines, start=1) if b'"event":"session.created"' in line)
    assert b'"mode":"read-only"' in lines[number - 1]
    lines[number - 1] = lines[number - 1].replace(b'"mode":"read-only"', b'"mode":"bypass"')
    log.write_bytes(b"".join(lines))

    text, as_json = cli_all(d.env, ["audit", "--verify"], ["audit", "--verify", "--json"])
    assert f"line {number}" in failed(text)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["ok"] is False
    assert any(f"line {number}" in problem for problem in report["problems"]), report


# --- 9. help and --json ----------------------------------------------------------------------------------


def test_help_lists_every_command(home: Path) -> None:
    text = ok(cli(sidecar_env(home), "--help")).stdout
    for command in ("serve", "status", "stop", "session", "routes", "audit", "service"):
        assert re.search(rf"^\s+{command}\s", text, re.MULTILINE), (command, text)


DATA_COMMANDS = [
    ["status"],
    ["session", "list"],
    ["session", "end"],
    ["session", "update"],
    ["routes", "list"],
    ["audit"],
    ["session", "new"],
]


@pytest.mark.parametrize("argv", DATA_COMMANDS, ids=" ".join)
def test_data_command_accepts_json(home: Path, argv: list[str]) -> None:
    assert "--json" in ok(cli(sidecar_env(home), *argv, "--help")).stdout


# --- 10. no daemon ----------------------------------------------------------------------------------------


def test_commands_without_a_daemon_say_so(tmp_path: Path) -> None:
    empty = sidecar_env(tmp_path / "empty")
    stale = sidecar_env(tmp_path / "stale")  # runtime.json left behind by a daemon that died
    paths = Paths.resolve(stale)
    paths.state.mkdir(mode=0o700, parents=True)
    paths.runtime_file.write_text(
        json.dumps(
            {
                "pid": dead_pid(),
                "url": "http://127.0.0.1:1",
                "port": 1,
                "control_token": "t",
                "started_at": 1.0,
                "version": __version__,
            }
        )
    )
    paths.runtime_file.chmod(0o600)
    commands = [(["status"], empty), (["stop"], empty), (["session", "list"], empty), (["status"], stale)]
    results = cli_all(empty, *(argv for argv, _ in commands), envs=[env for _, env in commands])
    for result in results:
        message = failed(result)
        assert NOT_RUNNING in message, (result.args, message)


async def test_a_pending_approval_is_granted_with_the_cli_and_the_retry_runs_once(
    d: DaemonProcess, workspace: Path
) -> None:
    raw = session_new(d, workspace, "--project", "cli-approvals", "--mode", "default")
    async with mcp_client(raw, mode="legacy") as client:
        first = await client.call_tool("note_save", {"text": "remember the CLI"})
        assert first.is_error and "sidecar approvals allow ap_" in tool_text(first)
        [pending] = json.loads(ok(d.cli("approvals", "list", "--json")).stdout)
        assert (pending["tool"], pending["state"]) == ("note_save", "pending")
        assert pending["approval_id"] in ok(d.cli("approvals", "list")).stdout
        ok(d.cli("approvals", "allow", pending["approval_id"]))
        retry = await client.call_tool("note_save", {"text": "remember the CLI"})
        replay = await client.call_tool("note_save", {"text": "remember the CLI"})
        read = await client.call_tool("notes_read", {})
    assert not retry.is_error
    assert replay.is_error  # single use: the replay asks again
    assert tool_text(read).count("remember the CLI") == 1
    assert "no pending" not in ok(d.cli("approvals", "list")).stdout  # the replay left a new one
    failed(d.cli("approvals", "allow", pending["approval_id"], check=False))  # spent: not pending any more
