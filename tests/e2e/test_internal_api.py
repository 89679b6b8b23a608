"""The internal API through the real daemon: a local connector reaches its upstream and never holds its token.

A real AS (panva's ``oidc-provider``, ``tests/oauth_as``, rotating refresh tokens) with a client the
"user" registered (id + secret, the secret given with ``--client-secret-file``); an upstream stand-in
(``tests/oauth/upstream_api.py``) that accepts only tokens the AS says are active; and a connector
package whose real MCP server (``tests/oauth/api_connector.py``) calls ``/mcp/internal/up/api/...``
with its own credential and its session's envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

from sidecar.paths import Paths
from tests.conftest import Daemon, mcp_client, raw_request, running_daemon
from tests.e2e.test_oauth_broker import browse
from tests.helpers import child_pids, tool_text, wait_until
from tests.oauth.real_as import IssuerLog, authorization_server, free_port
from tests.oauth.upstream_api import Upstream

pytestmark = pytest.mark.slow

BOUND = 30.0
CONNECTOR = Path(__file__).resolve().parents[1] / "oauth" / "api_connector.py"
CLIENT_ID, CLIENT_SECRET = "users-own-app", "users-own-secret"


@dataclass
class World(IssuerLog):
    daemon: Daemon
    upstream: Upstream
    away: Upstream


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])


def _package(root: Path, issuer: str, upstream: str) -> str:
    directory = root / "up"
    directory.mkdir(parents=True, mode=0o700)
    files: dict[str, Any] = {
        "connector.json": {
            "id": "up",
            "name": "Upstream",
            "description": "Reads items from a test upstream through sidecar's internal API",
            "version": "0.1.0",
            "type": "mcp",
            "tools": {"fetch": {"risk": "LOW"}},
        },
        "mcp.json": {
            "mcpServers": {
                "up": {
                    "command": "python3",
                    "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py"],
                    "env": {
                        "API_BASE": "${SIDECAR_LOCAL_MCP_ORIGIN}/mcp/internal/up/api",
                        "API_AUTHORIZATION": "${SIDECAR_LOCAL_MCP_AUTHORIZATION}",
                        "API_CONTEXT": "${SIDECAR_MCP_CONTEXT}",
                    },
                }
            }
        },
        "oauth-client.json": {
            "issuer": issuer,
            "scopes": ["openid", "offline_access"],
            "authorize_params": {"prompt": "consent"},
            "upstream": {"base_url": upstream, "paths": ["/items/", "/slow"], "methods": ["GET"]},
        },
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content))
    shutil.copy(CONNECTOR, directory / "server.py")
    for child in directory.iterdir():
        child.chmod(0o600)
    return "up"


@pytest.fixture
def world_env() -> dict[str, str]:
    """Extra environment of the AS (a test parametrizes it, e.g. a short access token lifetime)."""
    return {}


@pytest.fixture
async def world(home: Path, workspace: Path, tmp_path: Path, world_env: dict[str, str]) -> AsyncIterator[World]:
    async with oauth_world(workspace, tmp_path, world_env, package=_package) as found:
        yield found


@contextlib.asynccontextmanager
async def oauth_world(
    workspace: Path,
    tmp_path: Path,
    env: dict[str, str],
    *,
    package: Callable[[Path, str, str], str],
    upstream_app: Callable[[Upstream], web.Application] = Upstream.app,
) -> AsyncIterator[World]:
    """The daemon, the AS, the upstream stand-in (``upstream_app``) and a trusted package written by
    ``package(connectors_dir, issuer, upstream_url)``, which returns the package's id."""
    as_port = free_port()
    issuer = f"http://127.0.0.1:{as_port}"
    upstream, away = Upstream(issuer), Upstream(issuer)
    runners = []
    try:
        away_runner, away_port = await _serve(away.app())
        runners.append(away_runner)
        upstream.away = f"http://127.0.0.1:{away_port}/items/1"
        up_runner, up_port = await _serve(upstream_app(upstream))
        runners.append(up_runner)
        async with running_daemon(Paths.resolve(), workspace) as daemon:
            as_env = {
                "STATIC_CLIENT_ID": CLIENT_ID,
                "STATIC_CLIENT_SECRET": CLIENT_SECRET,
                "STATIC_REDIRECT_URI": f"http://127.0.0.1:{daemon.port}/oauth/callback",
                **env,
            }
            with authorization_server(tmp_path, as_port, f"http://127.0.0.1:{up_port}", **as_env) as log:
                connector_id = package(daemon.paths.data / "connectors", issuer, f"http://127.0.0.1:{up_port}")
                shown = await daemon.control("POST", f"/control/connectors/{connector_id}/trust")
                assert shown["state"] == "trusted", shown
                yield World(log.issuer, log.events, daemon, upstream, away)
                upstream.release.set()
    finally:
        upstream.release.set()
        for runner in runners:
            await runner.cleanup()


async def sign_in(world: World, tmp_path: Path, connector_id: str = "up") -> None:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    secret.chmod(0o600)
    body = {"client_id": CLIENT_ID, "client_secret_file": str(secret)}
    started = await world.daemon.control("POST", f"/control/connectors/{connector_id}/connect", body)
    assert started["authorization_url"].startswith(world.issuer), started
    page = await browse(started["browser_url"])
    assert page.status_code == 200 and "You can close this tab" in page.text, page.text
    assert (await world.daemon.control("GET", f"/control/connectors/{connector_id}"))["auth"] == "ready"


async def fetch(session: dict[str, Any], path: str) -> str:
    async with mcp_client(session) as client:
        return tool_text(await client.call_tool("mcp__up__fetch", {"path": path}))


def _connector_pids() -> list[int]:
    """The connector's own processes (not the ``bwrap`` ones around each: ``helpers.sandboxes``)."""
    found = []
    for pid in child_pids():
        with contextlib.suppress(psutil.Error):
            if any(arg.endswith("/up/server.py") for arg in psutil.Process(pid).cmdline()):
                found.append(pid)
    return found


def _stored_tokens(daemon: Daemon) -> list[str]:
    from sidecar.store.credentials import CredentialStore, choose_key_source

    data = daemon.paths.data
    store = CredentialStore(
        data / "credentials.enc", choose_key_source(f"credentials:{data}", data / "credentials.key")
    )
    tokens = []
    for record in store.records("up"):
        secret = store.get(record) or {}
        tokens += [v for k, v in (secret.get("tokens") or {}).items() if k in ("access_token", "refresh_token")]
    assert tokens
    return tokens


def _process_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


async def _raw_response(
    world: World, method: str, target: str, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    port = world.daemon.port
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return await raw_request(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


async def _raw(world: World, method: str, target: str, headers: dict[str, str]) -> int:
    status, _, _ = await _raw_response(world, method, target, headers)
    return status


async def test_the_connector_reaches_its_upstream_and_no_token_is_in_its_environment_argv_or_files(
    world: World, tmp_path: Path
) -> None:
    await sign_in(world, tmp_path)
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert await fetch(session, "/items/7") == '200 {"item": "7"}'
    assert world.upstream.seen[-1] == {"method": "GET", "path": "/items/7", "bearer": True}
    (pid,) = _connector_pids()
    environ = _process_environ(pid)
    assert environ["API_AUTHORIZATION"].startswith("Bearer ")
    opened = b""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("/") and Path(target).is_file():
                opened += Path(target).read_bytes()
    exposed = Path(f"/proc/{pid}/environ").read_bytes() + Path(f"/proc/{pid}/cmdline").read_bytes() + opened
    for token in _stored_tokens(world.daemon) + world.upstream.tokens:
        assert token.encode() not in exposed
    records = world.daemon.audit_events("internal.request")
    assert records[-1]["path"] == "/items/*" and records[-1]["status"] == 200 and records[-1]["bytes"] > 0
    assert "7" not in json.dumps(records[-1]["path"])


async def test_every_escape_is_refused_and_nothing_reaches_any_upstream(world: World, tmp_path: Path) -> None:
    await sign_in(world, tmp_path)
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(session, "/items/1")).startswith("200 ")
    (pid,) = _connector_pids()
    environ = _process_environ(pid)
    headers = {"Authorization": environ["API_AUTHORIZATION"], "X-Sidecar-Context": environ["API_CONTEXT"]}
    status, answer_headers, body = await _raw_response(world, "GET", "/mcp/internal/up/api/items/2", headers)
    assert (status, body) == (200, b'{"item": "2"}')  # the credential works
    assert answer_headers["x-ratelimit-remaining"] == "4999"
    assert "set-cookie" not in answer_headers  # nothing credential-like comes back
    status, answer_headers, _ = await _raw_response(world, "GET", "/mcp/internal/up/api/items/2", {})
    assert status == 401 and answer_headers["www-authenticate"] == 'Bearer realm="sidecar"'
    sent = len(world.upstream.seen)
    escapes = {
        "/mcp/internal/up/api/items/../../admin": (400, 403, 404),
        "/mcp/internal/up/api/items/..%2Fadmin": (403,),
        "/mcp/internal/up/api/items%2F..%2Fadmin": (403,),
        "/mcp/internal/up/api/items/a%2Fb": (403,),
        "/mcp/internal/up/api/items/user@evil.example": (403,),
        "/mcp/internal/up/api//evil.example/items/1": (403,),
        "/mcp/internal/up/api/admin": (403,),
        "http://evil.example/mcp/internal/up/api/items/1": (403,),
    }
    for target, allowed in escapes.items():
        status = await _raw(world, "GET", target, headers)
        assert status in allowed, (target, status)
    assert await _raw(world, "DELETE", "/mcp/internal/up/api/items/1", headers) == 403  # a method not declared
    assert len(world.upstream.seen) == sent  # nothing was sent upstream
    # A redirect to another origin is refused: the token never goes there.
    assert await _raw(world, "GET", "/mcp/internal/up/api/items/away", headers) == 403
    assert world.upstream.seen[-1]["path"] == "/items/away"
    assert world.away.seen == []
    refused = [r for r in world.daemon.audit_events("internal.request") if r["status"] == 403]
    assert len(refused) >= 8 and all("evil" not in json.dumps(r) for r in refused)


async def test_a_credential_is_useless_on_another_route_with_another_session_or_after_its_process(
    world: World, tmp_path: Path
) -> None:
    await sign_in(world, tmp_path)
    first = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    second = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(first, "/items/1")).startswith("200 ")
    (pid,) = _connector_pids()
    environ = _process_environ(pid)
    credential, envelope = environ["API_AUTHORIZATION"], environ["API_CONTEXT"]
    own = {"Authorization": credential, "X-Sidecar-Context": envelope}
    sent = len(world.upstream.seen)
    assert await _raw(world, "GET", "/mcp/internal/other/api/items/1", own) == 401  # another connector's route
    other_session = {"Authorization": credential, "X-Sidecar-Context": second["headers"]["X-Sidecar-Context"]}
    assert await _raw(world, "GET", "/mcp/internal/up/api/items/1", other_session) == 401
    route_token = {"Authorization": first["headers"]["Authorization"], "X-Sidecar-Context": envelope}
    assert await _raw(world, "GET", "/mcp/internal/up/api/items/1", route_token) == 401  # a route token is no key
    assert await _raw(world, "GET", "/mcp/items/1", own) in (401, 404)  # and the credential opens nothing else
    assert len(world.upstream.seen) == sent
    await world.daemon.control("DELETE", f"/control/sessions/{first['session_id']}")
    await wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    assert await _raw(world, "GET", "/mcp/internal/up/api/items/1", own) in (401, 403)
    assert len(world.upstream.seen) == sent


@pytest.mark.parametrize("world_env", [{"AT_TTL": "8"}])
async def test_twenty_concurrent_calls_across_a_rotation_make_one_refresh_and_no_restart(
    world: World, tmp_path: Path
) -> None:
    await sign_in(world, tmp_path)
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(session, "/items/0")).startswith("200 ")
    (pid,) = _connector_pids()
    access = world.upstream.tokens[-1]

    async def expired() -> bool:
        return not (await world.introspect(access))["active"]

    await wait_until(expired, timeout=BOUND, interval=0.2)  # the AS rotates on the next refresh
    before = len(world.grants("refresh_token"))
    async with mcp_client(session) as client:
        results = await asyncio.wait_for(
            asyncio.gather(*(client.call_tool("mcp__up__fetch", {"path": f"/items/{i}"}) for i in range(20))), BOUND
        )
    assert sorted(tool_text(r) for r in results) == sorted(f'200 {{"item": "{i}"}}' for i in range(20))
    assert len(world.grants("refresh_token")) - before == 1
    assert not [e for e in world.grants() if e["event"] == "grant.error"]
    assert _connector_pids() == [pid]


async def test_revoke_mid_call_ends_the_call_unauthorized_and_the_as_forgets_the_tokens(
    world: World, tmp_path: Path
) -> None:
    await sign_in(world, tmp_path)
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(session, "/items/1")).startswith("200 ")
    tokens = _stored_tokens(world.daemon)
    call = asyncio.create_task(fetch(session, "/slow"))
    try:
        await asyncio.wait_for(world.upstream.slow_started.wait(), BOUND)
        revoked = await world.daemon.control("POST", "/control/connectors/up/revoke")
        assert revoked["remote"] == "revoked", revoked
        text = await asyncio.wait_for(call, BOUND)
    finally:
        world.upstream.release.set()
        if not call.done():
            call.cancel()
    assert text.startswith("unauthorized: "), text
    for token in tokens:
        assert not (await world.introspect(token))["active"]
    later = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(later, "/items/1")).startswith("unauthorized: ")


async def test_untrust_revokes_the_credentials_at_once(world: World, tmp_path: Path) -> None:
    await sign_in(world, tmp_path)
    session = await world.daemon.new_session(mode="bypass", allow=["mcp__up__*"])
    assert (await fetch(session, "/items/1")).startswith("200 ")
    (pid,) = _connector_pids()
    environ = _process_environ(pid)
    own = {"Authorization": environ["API_AUTHORIZATION"], "X-Sidecar-Context": environ["API_CONTEXT"]}
    sent = len(world.upstream.seen)
    shown = await world.daemon.control("POST", "/control/connectors/up/untrust")
    assert shown["state"] == "configured", shown
    assert await _raw(world, "GET", "/mcp/internal/up/api/items/1", own) == 401
    assert len(world.upstream.seen) == sent
