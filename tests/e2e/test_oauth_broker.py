"""The OAuth broker through the real daemon, against a real authorization server nobody here wrote.

panva's ``oidc-provider`` (``tests/oauth_as``, Node, auto-approving) in front of the SDK's own MCP server
checking tokens by introspection (``tests/oauth/resource_server.py``). The browser is an HTTP client
following the authorization URL through the AS's interactions to the daemon's ``/oauth/callback``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.attackers import needs_other_user, watching_command_lines
from tests.browsers import chromium_as_browser, needs_chromium
from tests.conftest import Daemon, mcp_client, running_daemon
from tests.helpers import tool_text, write_user_servers
from tests.oauth.real_as import IssuerLog, authorization_server, free_port, stop, wait_port

pytestmark = pytest.mark.slow

BOUND = 30.0


@dataclass
class Servers(IssuerLog):
    mcp_url: str


@contextlib.contextmanager
def oauth_servers(tmp_path: Path, **env: str) -> Iterator[Servers]:
    as_port, rs_port = free_port(), free_port()
    mcp_url = f"http://127.0.0.1:{rs_port}/mcp"
    with authorization_server(tmp_path, as_port, mcp_url, **env) as issuer:
        root = Path(__file__).resolve().parents[2]
        with (tmp_path / "rs.log").open("wb") as rs_log:
            rs = subprocess.Popen(
                [sys.executable, "-m", "tests.oauth.resource_server", str(rs_port), issuer.issuer],
                cwd=root,
                stdout=subprocess.DEVNULL,
                stderr=rs_log,
            )
        try:
            wait_port(rs_port, rs, "resource server")
            yield Servers(issuer.issuer, issuer.events, mcp_url)
        finally:
            stop(rs)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    with oauth_servers(tmp_path) as found:
        yield found


@pytest.fixture
async def daemon(home: Path, workspace: Path) -> AsyncIterator[Daemon]:
    from sidecar.paths import Paths

    async with running_daemon(Paths.resolve(), workspace) as d:
        yield d


async def browse(url: str) -> httpx2.Response:
    """A browser stand-in: follow the authorization URL (cookies kept) to the daemon's callback page."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=BOUND) as http:
        return await http.get(url)


async def trust_remote(daemon: Daemon, servers: Servers) -> dict[str, Any]:
    write_user_servers(daemon, {"remote": {"type": "http", "url": servers.mcp_url}})
    return dict(await daemon.control("POST", "/control/connectors/remote/trust"))


async def sign_in(daemon: Daemon) -> None:
    started = await daemon.control("POST", "/control/connectors/remote/connect")
    assert started["authorization_url"].startswith("http://127.0.0.1:"), started
    page = await browse(started["browser_url"])
    assert page.status_code == 200, page.text
    assert "You can close this tab" in page.text
    assert page.url.path == "/oauth/callback"


async def call_echo(daemon: Daemon, session: dict[str, Any], text: str) -> str:
    async with mcp_client(session) as client:
        return tool_text(await client.call_tool("mcp__remote__echo", {"text": text}))


async def test_trust_before_sign_in_fails_fast_with_the_connect_hint(daemon: Daemon, servers: Servers) -> None:
    shown = await trust_remote(daemon, servers)
    assert "needs a sign-in: run sidecar connectors connect remote" in shown["error"], shown
    found = await daemon.control("GET", "/control/connectors/remote")
    assert found["auth"] == "unauthorized"
    status = await daemon.control("GET", "/control/status")
    assert status["storage"]["insecure"] in (True, False) and status["storage"]["credentials"]


async def test_sign_in_through_the_callback_then_a_tool_call_works(daemon: Daemon, servers: Servers) -> None:
    await trust_remote(daemon, servers)
    await sign_in(daemon)
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "ready", shown
    assert shown["state"] in ("trusted", "connected"), shown  # tools learned once signed in
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    assert await call_echo(daemon, session, "hello") == "hello"
    events = [e["event"] for e in daemon.audit_events() if e["event"].startswith("oauth.")]
    assert "oauth.connect" in events


async def test_revoke_deletes_revokes_remotely_and_the_next_call_needs_a_sign_in(
    daemon: Daemon, servers: Servers
) -> None:
    await trust_remote(daemon, servers)
    await sign_in(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    assert await call_echo(daemon, session, "one") == "one"
    grant = await _stored_grant(daemon)
    revoked = await daemon.control("POST", "/control/connectors/remote/revoke")
    assert revoked["remote"] == "revoked" and revoked["auth"] == "unauthorized", revoked
    assert (await servers.introspect(grant["tokens"]["access_token"]))["active"] is False
    assert (await servers.introspect(grant["tokens"]["refresh_token"]))["active"] is False
    async with mcp_client(session) as client:
        result = await client.call_tool("mcp__remote__echo", {"text": "two"})
    assert result.is_error and "run sidecar connectors connect remote" in tool_text(result)
    assert any(e["event"] == "oauth.revoke" for e in daemon.audit_events())


async def _stored_grant(daemon: Daemon) -> dict[str, Any]:
    from sidecar.store.credentials import CredentialStore, choose_key_source

    data = daemon.paths.data
    store = CredentialStore(
        data / "credentials.enc", choose_key_source(f"credentials:{data}", data / "credentials.key")
    )
    # A pre-registered client is filed before discovery names the issuer: the newest record is the grant.
    secrets = [store.get(record) for record in store.records("remote")]
    secret = max((s for s in secrets if s is not None), key=lambda s: s.get("saved_at", 0), default=None)
    assert secret is not None
    return secret


async def test_an_authorization_server_without_s256_is_refused_before_any_browser(
    daemon: Daemon, tmp_path: Path
) -> None:
    with oauth_servers(tmp_path, NO_S256="1") as servers:
        await trust_remote(daemon, servers)
        refused = await daemon.control("POST", "/control/connectors/remote/connect", expect=None)
        assert "S256" in json.dumps(refused), refused
        assert not servers.grants()
        events = [json.loads(x) for x in servers.events.read_text().splitlines() if x.startswith("{")]
        assert not [e for e in events if e["event"] == "registration"], events  # refused before registering
        shown = await daemon.control("GET", "/control/connectors/remote")
        assert shown["auth"] == "error" and "S256" in shown["auth_reason"]


async def test_concurrent_calls_on_an_expired_token_refresh_once(daemon: Daemon, tmp_path: Path) -> None:
    # 8 s tokens: the refreshed one must outlive the 20 calls even on a loaded machine, or a second,
    # legitimate refresh would be counted.
    with oauth_servers(tmp_path, AT_TTL="8") as servers:
        await trust_remote(daemon, servers)
        await sign_in(daemon)
        sessions = [await daemon.new_session(mode="bypass", allow=["mcp__remote__*"]) for _ in range(3)]
        assert await call_echo(daemon, sessions[0], "warm") == "warm"
        before = len(servers.grants("refresh_token"))
        await _until_inactive(servers, (await _stored_grant(daemon))["tokens"]["access_token"])

        async def calls(session: dict[str, Any], count: int) -> list[str]:
            async with mcp_client(session) as client:
                results = await asyncio.gather(
                    *(client.call_tool("mcp__remote__echo", {"text": str(i)}) for i in range(count))
                )
            return [tool_text(r) for r in results]

        done = await asyncio.wait_for(
            asyncio.gather(calls(sessions[0], 7), calls(sessions[1], 7), calls(sessions[2], 6)), 60
        )
        expected = [str(i) for i in range(7)] * 2 + [str(i) for i in range(6)]
        assert sorted(text for texts in done for text in texts) == sorted(expected)
        assert len(servers.grants("refresh_token")) - before == 1
        assert not [e for e in servers.grants() if e["event"] == "grant.error"]


async def _until_inactive(servers: Servers, token: str) -> None:
    """Wait (bounded) until the AS says the access token has expired."""
    async with asyncio.timeout(BOUND):
        while (await servers.introspect(token))["active"]:
            await asyncio.sleep(0.25)


async def test_no_token_reaches_a_file_or_a_log_line(
    daemon: Daemon, servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await trust_remote(daemon, servers)
    await sign_in(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    assert await call_echo(daemon, session, "x") == "x"
    grant = await _stored_grant(daemon)
    secrets = [grant["tokens"]["access_token"], grant["tokens"]["refresh_token"]]
    assert all(secrets)
    await daemon.control("GET", "/control/status")
    await daemon.control("GET", "/control/connectors/remote")
    written = [p for p in daemon.paths.config.parent.rglob("*") if p.is_file()]
    written += [p for p in (daemon.paths.data, daemon.paths.state) for p in p.rglob("*") if p.is_file()]
    for path in written:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, path
    for secret in secrets:
        assert secret not in caplog.text


STATIC_ID, STATIC_SECRET = "sidecar-static", "static-secret-value-0123456789"


async def test_a_pre_registered_client_from_mcp_json_signs_in_without_dynamic_registration(
    daemon: Daemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_file = tmp_path / "client-secret"
    secret_file.write_text(STATIC_SECRET + "\n")
    secret_file.chmod(0o600)
    redirect = f"http://127.0.0.1:{daemon.port}/oauth/callback"
    static = {"STATIC_CLIENT_ID": STATIC_ID, "STATIC_CLIENT_SECRET": STATIC_SECRET, "STATIC_REDIRECT_URI": redirect}
    with oauth_servers(tmp_path, NO_REGISTRATION="1", **static) as servers:
        oauth = {"clientId": STATIC_ID, "clientSecretFile": str(secret_file), "scopes": ["mcp"]}
        write_user_servers(daemon, {"remote": {"type": "http", "url": servers.mcp_url, "oauth": oauth}})
        await daemon.control("POST", "/control/connectors/remote/trust")
        await sign_in(daemon)
        session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
        assert await call_echo(daemon, session, "static") == "static"
        grant = await _stored_grant(daemon)
        assert grant["client"]["client_id"] == STATIC_ID
        assert (await servers.introspect(grant["tokens"]["access_token"]))["client_id"] == STATIC_ID
        events = [json.loads(x) for x in servers.events.read_text().splitlines() if x.startswith("{")]
        assert not [e for e in events if e["event"] == "registration"], events
        assert STATIC_SECRET.encode() not in daemon.audit_bytes() and STATIC_SECRET not in caplog.text

        # Another client id is another launch config: it needs trust again before anything signs in.
        oauth["clientId"] = "someone-else"
        write_user_servers(daemon, {"remote": {"type": "http", "url": servers.mcp_url, "oauth": oauth}})
        refused = await daemon.control("POST", "/control/connectors/remote/connect", expect=None)
        assert "not trusted as configured now" in json.dumps(refused), refused


async def test_the_connectors_own_route_signs_its_relayed_connection_in_and_fails_fast_without_a_sign_in(
    daemon: Daemon, servers: Servers
) -> None:
    from mcp.shared.exceptions import MCPError

    await trust_remote(daemon, servers)
    await sign_in(daemon)  # the route exists once the tools are learned, which needs the sign-in
    session = await daemon.new_session(mode="bypass", connector="remote")
    assert session["url"].endswith("/mcp/connectors/remote")
    async with asyncio.timeout(BOUND), mcp_client(session) as client:
        assert tool_text(await client.call_tool("echo", {"text": "relayed"})) == "relayed"
    async with asyncio.timeout(BOUND), mcp_client(session, mode="auto") as client:
        assert tool_text(await client.call_tool("echo", {"text": "modern"})) == "modern"

    await daemon.control("POST", "/control/connectors/remote/revoke")
    grants = len(servers.grants())
    started = time.monotonic()
    with pytest.raises(BaseException) as caught:
        async with asyncio.timeout(BOUND), mcp_client(session):
            pass
    (refused,) = _leaves(caught.value)
    assert isinstance(refused, MCPError), refused
    assert "needs a sign-in: run sidecar connectors connect remote" in str(refused)
    assert time.monotonic() - started < 5 and len(servers.grants()) == grants


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (anyio task groups wrap what the SDK client raises)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_after_a_restart_the_stored_sign_in_is_ready_and_refreshes_silently(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    from sidecar.paths import Paths

    with oauth_servers(tmp_path, AT_TTL="3") as servers:
        servers_config = {
            "remote": {"type": "http", "url": servers.mcp_url},
            "declared": {"type": "http", "url": servers.mcp_url, "oauth": {"clientId": "never-signed-in"}},
        }
        async with running_daemon(Paths.resolve(), workspace) as first:
            write_user_servers(first, servers_config)
            await first.control("POST", "/control/connectors/remote/trust")
            await sign_in(first)
            session = await first.new_session(mode="bypass", allow=["mcp__remote__*"])
            assert await call_echo(first, session, "before") == "before"
        codes, refreshes = len(servers.grants("authorization_code")), len(servers.grants("refresh_token"))
        await asyncio.sleep(3.2)  # the access token (3 s) expires while no daemon runs

        async with running_daemon(Paths.resolve(), workspace) as second:
            shown = await second.control("GET", "/control/connectors/remote")
            assert shown["auth"] == "ready", shown
            declared = await second.control("GET", "/control/connectors/declared")
            assert declared["auth"] == "unauthorized", declared
            session = await second.new_session(mode="bypass", allow=["mcp__remote__*"])
            assert await call_echo(second, session, "after") == "after"
        assert len(servers.grants("authorization_code")) == codes  # no new sign-in
        assert len(servers.grants("refresh_token")) == refreshes + 1  # one silent refresh


async def test_a_call_refused_for_scope_asks_for_a_sign_in_with_the_union_of_scopes(
    daemon: Daemon, servers: Servers
) -> None:
    from urllib.parse import parse_qs, urlsplit

    await trust_remote(daemon, servers)
    await sign_in(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    async with asyncio.timeout(BOUND), mcp_client(session) as client:
        refused = await client.call_tool("mcp__remote__admin_echo", {"text": "up"})
        assert refused.is_error, refused
        assert "admin" in tool_text(refused) and "run sidecar connectors connect remote" in tool_text(refused)
        # The grant still serves what it covers: same session, same connection.
        assert tool_text(await client.call_tool("mcp__remote__echo", {"text": "still"})) == "still"
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "ready" and "admin" in shown["auth_reason"], shown
    relayed = await daemon.new_session(mode="bypass", connector="remote")  # the connector's own route
    async with asyncio.timeout(BOUND), mcp_client(relayed) as client:
        with pytest.raises(Exception, match="run sidecar connectors connect remote"):
            await client.call_tool("admin_echo", {"text": "up"})
        assert tool_text(await client.call_tool("echo", {"text": "relayed"})) == "relayed"

    started = await daemon.control("POST", "/control/connectors/remote/connect")
    asked = parse_qs(urlsplit(started["authorization_url"]).query)["scope"][0].split()
    assert {"mcp", "admin"} <= set(asked), asked
    page = await browse(started["browser_url"])
    assert "You can close this tab" in page.text, page.text
    async with asyncio.timeout(BOUND), mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__remote__admin_echo", {"text": "up"})) == "up"
        assert tool_text(await client.call_tool("mcp__remote__echo", {"text": "both"})) == "both"
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "ready" and shown["auth_reason"] is None, shown
    assert {"mcp", "admin"} <= set(shown["granted_scopes"]) and shown["granted_beyond_asked"] == [], shown


async def _connect_command(home: Path, browser: str) -> tuple[int, str, str]:
    """``sidecar connectors connect remote`` with ``$BROWSER`` set: (exit code, stdout, stderr)."""
    from tests.conftest import sidecar_env

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sidecar", "connectors", "connect", "remote",
        cwd=Path(__file__).resolve().parents[2], env={**sidecar_env(home), "BROWSER": browser},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_connect_command_opens_the_browser_and_returns_once_signed_in(
    daemon: Daemon, servers: Servers, home: Path
) -> None:
    await trust_remote(daemon, servers)
    returncode, text, err = await _connect_command(home, f"{sys.executable} -m tests.oauth.browser %s")
    assert returncode == 0, (text, err)
    assert "Sign in to remote in your browser" in text and "browser: 200 /oauth/callback" in text
    assert text.rstrip().endswith("signed in to remote"), text
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "ready", shown
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    assert await call_echo(daemon, session, "cli") == "cli"


SECRET_MARKS = ("state=", "code_challenge=", "/oauth/start", "/authorize")
"""What of a sign-in must never be on a command line: the AS's query, the daemon's start link."""


@needs_chromium()
@needs_other_user()
async def test_connect_through_chromium_puts_no_sign_in_secret_on_any_command_line(
    daemon: Daemon, servers: Servers, home: Path, tmp_path: Path
) -> None:
    await trust_remote(daemon, servers)
    with chromium_as_browser(tmp_path) as browser:
        async with watching_command_lines() as seen:
            returncode, text, err = await _connect_command(home, browser)
    assert returncode == 0 and text.rstrip().endswith("signed in to remote"), (text, err)
    assert (await daemon.control("GET", "/control/connectors/remote"))["auth"] == "ready"
    opened = [line for line in seen if "chromium" in line and "open-signin-remote" in line]
    assert opened, "the watcher never saw the browser's command line"  # so it could have seen a leak
    assert [line for line in seen if any(mark in line for mark in SECRET_MARKS)] == []


async def _auth_state(daemon: Daemon, wanted: str) -> dict[str, Any]:
    """The connector's record once its sign-in state is ``wanted`` (bounded)."""
    async with asyncio.timeout(BOUND):
        while True:
            shown = dict(await daemon.control("GET", "/control/connectors/remote"))
            if shown["auth"] == wanted:
                return shown
            await asyncio.sleep(0.05)


async def test_a_sign_in_not_finished_in_time_ends_and_its_link_stops_working(
    daemon: Daemon, servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.oauth import broker

    monkeypatch.setattr(broker, "FLOW_TIMEOUT", 1.0)  # the production bound is ten minutes
    await trust_remote(daemon, servers)
    started = await daemon.control("POST", "/control/connectors/remote/connect")
    joined = await daemon.control("POST", "/control/connectors/remote/connect")
    assert joined["authorization_url"] == started["authorization_url"]  # one pending flow per connector
    shown = await _auth_state(daemon, "error")
    assert "was not finished within" in shown["auth_reason"], shown
    page = await browse(started["browser_url"])
    assert "not valid any more" in page.text and "You can close this tab" not in page.text
    assert not servers.grants("authorization_code")  # the late code was never exchanged
    again = await daemon.control("POST", "/control/connectors/remote/connect")
    assert again["authorization_url"] != started["authorization_url"]


async def test_a_state_alone_finishes_no_sign_in_only_the_browser_that_opened_the_start_link_does(
    daemon: Daemon, servers: Servers
) -> None:
    await trust_remote(daemon, servers)
    started = await daemon.control("POST", "/control/connectors/remote/connect")
    # Another browser (or process) that learned the authorization URL, state and all, gets a code from
    # the AS; the daemon's callback refuses it without the flow's cookie, and the state stays unspent.
    for _ in range(3):
        stolen = await browse(started["authorization_url"])
        assert stolen.status_code == 400 and stolen.url.path == "/oauth/callback"
        assert "not started in this browser" in stolen.text
    assert not servers.grants("authorization_code")  # no stolen code was exchanged
    assert (await daemon.control("GET", "/control/connectors/remote"))["auth"] == "starting"
    page = await browse(started["browser_url"])
    assert page.status_code == 200 and "You can close this tab" in page.text
    assert len(servers.grants("authorization_code")) == 1
    spent = await browse(started["browser_url"])  # a start link works once
    assert spent.status_code == 400 and "not valid any more" in spent.text


async def test_revoke_during_a_sign_in_ends_it_and_nothing_is_stored(daemon: Daemon, servers: Servers) -> None:
    await trust_remote(daemon, servers)
    started = await daemon.control("POST", "/control/connectors/remote/connect")
    revoked = await daemon.control("POST", "/control/connectors/remote/revoke")
    assert revoked["auth"] == "unauthorized" and revoked["remote"] == "nothing to revoke", revoked
    page = await browse(started["browser_url"])
    assert "not valid any more" in page.text, page.text
    assert not servers.grants("authorization_code")
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "unauthorized", shown
    assert _stored_records(daemon) == []  # the registration made for the flow went with the revoke


def _stored_records(daemon: Daemon) -> list[dict[str, Any]]:
    from sidecar.store.credentials import CredentialStore, choose_key_source

    data = daemon.paths.data
    if not (data / "credentials.enc").exists():
        return []
    store = CredentialStore(
        data / "credentials.enc", choose_key_source(f"credentials:{data}", data / "credentials.key")
    )
    return [s for s in (store.get(record) for record in store.records("remote")) if s is not None]


async def test_a_client_metadata_document_from_mcp_json_is_the_client_id_where_the_as_supports_it(
    daemon: Daemon, tmp_path: Path
) -> None:
    from urllib.parse import parse_qs, urlsplit

    document = "https://sidecar.example/oauth/client.json"
    with oauth_servers(tmp_path, CIMD="1") as servers:
        oauth = {"clientMetadataUrl": document, "scopes": ["mcp"]}
        write_user_servers(daemon, {"remote": {"type": "http", "url": servers.mcp_url, "oauth": oauth}})
        await daemon.control("POST", "/control/connectors/remote/trust")
        started = await daemon.control("POST", "/control/connectors/remote/connect")
        query = parse_qs(urlsplit(started["authorization_url"]).query)
        assert query["client_id"] == [document], query
        assert query["code_challenge_method"] == ["S256"] and "mcp" in query["scope"][0].split()
        events = [json.loads(x) for x in servers.events.read_text().splitlines() if x.startswith("{")]
        assert not [e for e in events if e["event"] == "registration"], events
        await daemon.control("POST", "/control/connectors/remote/revoke")  # ends the pending flow


async def test_a_tampered_record_costs_that_connector_its_sign_in_and_nothing_else(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    import base64

    from sidecar.paths import Paths

    with oauth_servers(tmp_path) as servers:
        async with running_daemon(Paths.resolve(), workspace) as first:
            await trust_remote(first, servers)
            await sign_in(first)
            store = first.paths.data / "credentials.enc"
        lines = [json.loads(line) for line in store.read_text().splitlines() if line.strip()]
        for record in lines:
            sealed = bytearray(base64.urlsafe_b64decode(str(record["data"])))
            sealed[5] ^= 0x01  # one bit of the ciphertext
            record["data"] = base64.urlsafe_b64encode(bytes(sealed)).decode()
        store.write_text("".join(json.dumps(record) + "\n" for record in lines))
        codes = len(servers.grants())

        async with running_daemon(Paths.resolve(), workspace) as second:
            shown = await second.control("GET", "/control/connectors/remote")
            assert shown["auth"] == "unauthorized" and "damaged" in shown["auth_reason"], shown
            status = await second.control("GET", "/control/status")
            assert status["storage"]["credentials"], status
            session = await second.new_session(mode="bypass", allow=["mcp__remote__*", "calculate"])
            async with mcp_client(session) as client:
                result = await client.call_tool("mcp__remote__echo", {"text": "no"})
                assert result.is_error and "run sidecar connectors connect remote" in tool_text(result)
                other = await client.call_tool("calculate", {"expression": "1+1"})  # the rest works
                assert not other.is_error and "2" in tool_text(other), other
            await sign_in(second)  # a new sign-in replaces the damaged record
            assert await call_echo(second, session, "again") == "again"
        assert len(servers.grants()) > codes
