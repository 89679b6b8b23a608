"""The front door (contract §3-4, §8): every way a request is turned away before anything runs.

Each test drives the real daemon on ``127.0.0.1:0`` with hand-written bytes on a raw socket, so header
edge cases (no ``Host`` on HTTP/1.0, two ``Host`` headers, absolute-form targets, two ``Authorization``
headers) reach the server exactly as sent. The request is a 2026-07-28-era single exchange that calls the
built-in ``calculate`` tool: ``test_the_valid_request_runs_the_tool_and_audits_the_call`` proves that exact
request succeeds and writes a ``tool.call`` record, and every negative test changes one thing and checks:

- the exact status and a JSON body carrying an error code, with no traceback and no credential in it;
- ``WWW-Authenticate: Bearer`` on every 401;
- nothing ran and nothing was written: the audit file is byte-for-byte what it was before the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio

from sidecar.config import Settings
from sidecar.paths import Paths
from tests.conftest import SHARED, Daemon, raw_request, running_daemon
from tests.helpers import initialize_request, response_head

PROTOCOL_2026: Final = "2026-07-28"
PROTOCOL_2025: Final = "2025-11-25"
ALLOWED_LOOKING_ORIGIN: Final = "http://localhost:5173"
IO_TIMEOUT: Final = 10.0  # seconds for one whole request/response exchange on loopback

Headers = list[tuple[str, str]]

pytestmark = SHARED  # one daemon for the module; each test has a session of its own


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error_code(self) -> str:
        """The error code of a JSON error body, whichever shape it has (JSON-RPC under /mcp, plain elsewhere)."""
        payload = self.json()
        error = payload["error"]
        if "jsonrpc" in payload:
            # Ours carry the sidecar code in ``data``; the SDK's own errors only the JSON-RPC code.
            assert isinstance(error["code"], int), payload
            return str(error.get("data", error["code"]))
        return str(error["code"])


@dataclass(frozen=True)
class Front:
    """A running daemon plus one session's credentials: everything a valid request needs."""

    daemon: Daemon
    session: dict[str, Any]

    @property
    def port(self) -> int:
        return self.daemon.port

    @property
    def token(self) -> str:
        return str(self.session["headers"]["Authorization"].removeprefix("Bearer "))

    @property
    def envelope(self) -> str:
        return str(self.session["headers"]["X-Sidecar-Context"])

    def tool_calls(self) -> list[dict[str, Any]]:
        """The ``tool.call`` records of this session (the daemon serves other tests' sessions too)."""
        return [c for c in self.daemon.audit_events("tool.call") if c["session"] == self.session["session_id"]]

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.token, self.envelope, self.daemon.control_token)


# --- building requests ----------------------------------------------------------------------------


def _call_body(expression: str = "1+1", **extra_arguments: Any) -> bytes:
    """The JSON-RPC ``tools/call`` of ``calculate`` in the 2026-07-28 era (protocol data in ``_meta``)."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "calculate",
            "arguments": {"expression": expression, **extra_arguments},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL_2026,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    return json.dumps(message, separators=(",", ":")).encode()


def _call_headers(front: Front) -> Headers:
    """Headers of the valid single-exchange ``tools/call``, in order; tests change exactly one thing."""
    return [
        ("Host", f"127.0.0.1:{front.port}"),
        ("Authorization", f"Bearer {front.token}"),
        ("X-Sidecar-Context", front.envelope),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", PROTOCOL_2026),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "calculate"),
    ]


def _without(headers: Headers, name: str) -> Headers:
    return [(k, v) for k, v in headers if k.lower() != name.lower()]


def _replaced(headers: Headers, name: str, value: str) -> Headers:
    assert any(k.lower() == name.lower() for k, _ in headers), name
    return [(k, value if k.lower() == name.lower() else v) for k, v in headers]


def _plus(headers: Headers, name: str, value: str) -> Headers:
    return [*headers, (name, value)]


def _encode(
    headers: Headers,
    body: bytes,
    *,
    method: str = "POST",
    target: str = "/mcp",
    version: str = "HTTP/1.1",
    content_length: int | None = None,
    chunked: bool = False,
) -> bytes:
    """One request as bytes; ``Connection: close`` so the reply ends at EOF."""
    length = len(body) if content_length is None else content_length
    lines = [f"{method} {target} {version}", *(f"{k}: {v}" for k, v in headers)]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        step = 64 * 1024
        body = (
            b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step]) for i in range(0, len(body), step))
            + b"0\r\n\r\n"
        )
    elif method in {"POST", "PUT", "PATCH"} or body:
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


async def _send(port: int, request: bytes) -> Reply:
    status, headers, body = await raw_request(port, request)
    return Reply(status, headers, body)


async def _send_read_one(port: int, request: bytes) -> Reply:
    """Like ``_send``, but stop after one ``Content-Length`` response instead of waiting for EOF.

    For refusals of a body the client has not finished sending: aiohttp answers at once and then keeps
    the connection open for its lingering time (10 s) to drain the rest, so EOF comes late.
    """
    async with asyncio.timeout(IO_TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request)
            await writer.drain()
            status, headers = response_head(await reader.readuntil(b"\r\n\r\n"))
            body = await reader.readexactly(int(headers["content-length"]))
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    return Reply(status, headers, body)


async def _refused(
    front: Front,
    request: bytes,
    *,
    status: int,
    code: str,
    send: Callable[[int, bytes], Awaitable[Reply]] = _send,
) -> Reply:
    """Send ``request``; assert the refusal and that nothing ran and nothing was written."""
    daemon = front.daemon
    before = daemon.audit_bytes()
    reply = await send(daemon.port, request)
    assert reply.status == status, reply
    _assert_json_error(reply, front.secrets)
    assert reply.error_code() == code, reply
    if status == 401:
        assert reply.headers.get("www-authenticate", "").startswith("Bearer"), reply.headers
    else:
        assert "www-authenticate" not in reply.headers, reply.headers
    assert "access-control-allow-origin" not in reply.headers, reply.headers
    assert daemon.audit_bytes() == before, "a refused request changed the audit log"
    assert not front.tool_calls(), "a refused request ran a tool"
    return reply


def _assert_json_error(reply: Reply, secrets: tuple[str, ...]) -> None:
    assert reply.headers.get("content-type", "").startswith("application/json"), reply
    text = reply.body.decode("utf-8")
    assert "Traceback" not in text, text
    for secret in secrets:
        assert secret not in text, "a credential was echoed in the error body"
    json.loads(text)


def _sse_or_json(reply: Reply) -> Any:
    """The one JSON-RPC message of a response, sent either as JSON or as one SSE ``data:`` event."""
    content_type = reply.headers.get("content-type", "")
    if content_type.startswith("application/json"):
        return reply.json()
    assert content_type.startswith("text/event-stream"), reply
    for line in reply.body.decode("utf-8").splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    raise AssertionError(f"no data event in {reply.body!r}")


# --- fixtures ---------------------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module")
async def front(shared_daemon: Daemon) -> Front:
    return Front(shared_daemon, await shared_daemon.new_session())


@pytest_asyncio.fixture(loop_scope="module")
async def other_daemon(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    """A second, independent daemon (its own home, so its own envelope key and route tokens)."""
    root = tmp_path / "other-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    async with running_daemon(paths, workspace) as other:
        yield other


# --- the positive control ---------------------------------------------------------------------------


async def test_the_valid_request_runs_the_tool_and_audits_the_call(front: Front) -> None:
    reply = await _send(front.port, _encode(_call_headers(front), _call_body()))

    assert reply.status == 200, reply
    message = _sse_or_json(reply)
    assert message["id"] == 1, message
    result = message["result"]
    assert not result.get("isError"), result
    assert "2" in json.dumps(result["content"]), result
    calls = front.tool_calls()
    assert len(calls) == 1, calls
    assert calls[0]["tool"] == "calculate"
    assert calls[0]["outcome"] == "ok"
    assert calls[0]["session"] == front.session["session_id"]
    assert "access-control-allow-origin" not in reply.headers


# --- contract §3: Host and the request target -----------------------------------------------------------


async def test_a_request_without_host_is_refused(front: Front) -> None:
    request = _encode(_without(_call_headers(front), "Host"), _call_body(), version="HTTP/1.0")
    await _refused(front, request, status=403, code="host_not_allowed")


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("127.0.0.1:{other_port}", id="wrong-port"),
        pytest.param("evil.example.com", id="dns-rebinding-name"),
        pytest.param("evil.example.com:{port}", id="dns-rebinding-name-with-our-port"),
        pytest.param("127.0.0.1", id="no-port"),
        pytest.param("localhost", id="localhost-no-port"),
        pytest.param("localhost.evil.example.com:{port}", id="loopback-prefix"),
        pytest.param("127.0.0.1:{port}@evil.example.com", id="userinfo-trick"),
        pytest.param("", id="empty"),
    ],
)
async def test_a_request_with_a_foreign_host_is_refused(front: Front, host: str) -> None:
    other_port = front.port + 1 if front.port < 65535 else front.port - 1
    value = host.format(port=front.port, other_port=other_port)
    request = _encode(_replaced(_call_headers(front), "Host", value), _call_body())
    await _refused(front, request, status=403, code="host_not_allowed")


async def test_a_dns_rebinding_initialize_is_refused_before_authentication(front: Front) -> None:
    # What the MCP conformance suite sends: a plain initialize, Host of an attacker's name, no credentials.
    # 403 from the guard, not 401: the Host check comes before anything else.
    initialize = initialize_request("conformance", protocol=PROTOCOL_2025)
    headers = [
        ("Host", "evil.example.com"),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ]
    request = _encode(headers, json.dumps(initialize).encode())
    await _refused(front, request, status=403, code="host_not_allowed")


def _parser_refusals(front: Front) -> dict[str, bytes]:
    """Requests aiohttp's HTTP parser refuses itself, before any middleware (so before the guard) runs."""
    valid = _call_headers(front)
    return {
        "two-host-headers": _encode(_plus(valid, "Host", f"localhost:{front.port}"), _call_body()),
        "header-over-the-size-limit": _encode(_plus(valid, "X-Padding", "a" * 9000), _call_body()),
        "request-line-over-the-size-limit": _encode(valid, _call_body(), target="/mcp?" + "a" * 9000),
        "too-many-headers": _encode(valid + [(f"X-Padding-{i}", "a") for i in range(200)], _call_body()),
        "content-length-and-chunked": _encode(_plus(valid, "Transfer-Encoding", "chunked"), b"0\r\n\r\n"),
    }


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        pytest.param("two-host-headers", 403, "host_not_allowed", id="two-host-headers"),
        pytest.param("header-over-the-size-limit", 400, "bad_request", id="header-over-the-size-limit"),
        pytest.param("request-line-over-the-size-limit", 400, "bad_request", id="request-line-over-the-size-limit"),
        pytest.param("too-many-headers", 400, "bad_request", id="too-many-headers"),
        pytest.param("content-length-and-chunked", 400, "bad_request", id="content-length-and-chunked"),
    ],
)
async def test_a_request_the_http_parser_refuses_gets_a_json_error_and_runs_nothing(
    front: Front, case: str, status: int, code: str
) -> None:
    # aiohttp's parser refuses these before any middleware; the daemon's connection handler still answers
    # in JSON (sidecar.http.JsonErrorRunner), and two Host headers get the guard's 403.
    await _refused(front, _parser_refusals(front)[case], status=status, code=code)


@pytest.mark.parametrize("route", ["mcp-route-token", "control-token"])
async def test_an_oversized_authorization_header_does_not_log_the_token(
    front: Front, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    if route == "mcp-route-token":
        token, headers, target = front.token, _call_headers(front), "/mcp"
    else:
        token, target = front.daemon.control_token, "/control/status"
        headers = [("Host", f"127.0.0.1:{front.port}"), ("Authorization", f"Bearer {token}")]
    padded = _replaced(headers, "Authorization", f"Bearer {token}" + " " * 9000 + "x")
    with caplog.at_level(logging.DEBUG):
        reply = await _refused(front, _encode(padded, _call_body(), target=target), status=400, code="bad_request")
    assert token.encode() not in reply.body
    assert token not in caplog.text, "a bearer token was written to the log"


async def test_an_absolute_form_target_is_refused(front: Front) -> None:
    request = _encode(_call_headers(front), _call_body(), target="http://evil.com/mcp")
    await _refused(front, request, status=403, code="host_not_allowed")


async def test_an_absolute_form_target_naming_the_daemon_itself_is_refused(front: Front) -> None:
    target = f"http://127.0.0.1:{front.port}/mcp"
    request = _encode(_call_headers(front), _call_body(), target=target)
    await _refused(front, request, status=403, code="host_not_allowed")


# --- contract §3: Origin and Sec-Fetch-Site -------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param("null", id="null"),
        pytest.param("", id="empty"),
        pytest.param("http://evil.com", id="foreign"),
        pytest.param(ALLOWED_LOOKING_ORIGIN, id="localhost-not-configured"),
        # The daemon's own origin passes on /mcp (with the route token): tests/security/test_own_origin.py.
        pytest.param("http://127.0.0.1:{other_port}", id="the-daemons-address-on-another-port"),
        pytest.param("not a url", id="unparsable"),
        pytest.param("http://evil.com/path", id="unparsable-with-path"),
        pytest.param("http://user@127.0.0.1:{port}", id="unparsable-userinfo"),
    ],
)
async def test_a_request_with_a_disallowed_origin_is_refused(front: Front, origin: str) -> None:
    value = origin.format(port=front.port, other_port=front.port + 1)
    request = _encode(_plus(_call_headers(front), "Origin", value), _call_body())
    await _refused(front, request, status=403, code="origin_not_allowed")


@pytest.mark.parametrize("site", ["cross-site", "same-site", "Cross-Site"])
async def test_a_cross_site_browser_request_is_refused(front: Front, site: str) -> None:
    request = _encode(_plus(_call_headers(front), "Sec-Fetch-Site", site), _call_body())
    await _refused(front, request, status=403, code="cross_site_request")


# --- contract §4: the route token -----------------------------------------------------------------------


def _auth_variants(front: Front) -> dict[str, tuple[Headers, str]]:
    """(headers, target) per way of presenting a bad or misplaced route token."""
    valid = _call_headers(front)
    wrong = "A" * 43  # the shape of a real token, not the route's
    return {
        "missing": (_without(valid, "Authorization"), "/mcp"),
        "wrong": (_replaced(valid, "Authorization", f"Bearer {wrong}"), "/mcp"),
        "empty-bearer": (_replaced(valid, "Authorization", "Bearer "), "/mcp"),
        "non-ascii": (_replaced(valid, "Authorization", "Bearer t\u00f6ken"), "/mcp"),
        "token-with-garbage": (_replaced(valid, "Authorization", f"Bearer {front.token}x"), "/mcp"),
        "no-scheme": (_replaced(valid, "Authorization", front.token), "/mcp"),
        "basic-scheme": (_replaced(valid, "Authorization", f"Basic {front.token}"), "/mcp"),
        "two-authorization-headers": (_plus(valid, "Authorization", f"Bearer {front.token}"), "/mcp"),
        "query-token": (_without(valid, "Authorization"), f"/mcp?token={front.token}"),
        "query-access-token": (_without(valid, "Authorization"), f"/mcp?access_token={front.token}"),
        "control-token": (
            _replaced(valid, "Authorization", f"Bearer {front.daemon.control_token}"),
            "/mcp",
        ),
    }


@pytest.mark.parametrize(
    "variant",
    [
        "missing",
        "wrong",
        "empty-bearer",
        "non-ascii",
        "token-with-garbage",
        "no-scheme",
        "basic-scheme",
        "two-authorization-headers",
        "query-token",
        "query-access-token",
        "control-token",
    ],
)
async def test_a_bad_or_misplaced_route_token_is_refused(front: Front, variant: str) -> None:
    headers, target = _auth_variants(front)[variant]
    await _refused(front, _encode(headers, _call_body(), target=target), status=401, code="unauthorized")


async def test_the_token_of_a_rotated_route_is_refused(front: Front) -> None:
    await front.daemon.control("POST", "/control/routes/connector-proxy/rotate")
    request = _encode(_call_headers(front), _call_body())
    await _refused(front, request, status=401, code="unauthorized")


# --- contract §4: the session envelope ------------------------------------------------------------------


def _flip(text: str, index: int) -> str:
    """``text`` with the base64url character at ``index`` swapped for another one (still canonical)."""
    char = text[index]
    return text[:index] + ("B" if char == "A" else "A") + text[index + 1 :]


def _envelope_variants(envelope: str) -> dict[str, str | None]:
    version, kid, payload, mac = envelope.split(".")
    return {
        "missing": None,
        "payload-char-flipped": f"{version}.{kid}.{_flip(payload, len(payload) // 2)}.{mac}",
        "mac-char-flipped": f"{version}.{kid}.{payload}.{_flip(mac, 0)}",
        "payload-padded": f"{version}.{kid}.{payload}{'=' * (-len(payload) % 4) or '='}.{mac}",
        "mac-padded": f"{version}.{kid}.{payload}.{mac}=",
        "unknown-kid": f"{version}.{_flip(kid, 0)}.{payload}.{mac}",
        "other-version": f"v2.{kid}.{payload}.{mac}",
        "garbage": "not-an-envelope",
    }


@pytest.mark.parametrize(
    "variant",
    [
        "missing",
        "payload-char-flipped",
        "mac-char-flipped",
        "payload-padded",
        "mac-padded",
        "unknown-kid",
        "other-version",
        "garbage",
    ],
)
async def test_a_bad_session_envelope_is_refused(front: Front, variant: str) -> None:
    envelope = _envelope_variants(front.envelope)[variant]
    headers = _without(_call_headers(front), "X-Sidecar-Context")
    if envelope is not None:
        headers = _plus(headers, "X-Sidecar-Context", envelope)
    await _refused(front, _encode(headers, _call_body()), status=403, code="invalid_session")


async def test_two_session_envelopes_are_refused(front: Front) -> None:
    headers = _plus(_call_headers(front), "X-Sidecar-Context", front.envelope)
    await _refused(front, _encode(headers, _call_body()), status=403, code="invalid_session")


async def test_the_envelope_of_an_ended_session_is_refused(front: Front) -> None:
    await front.daemon.control("DELETE", f"/control/sessions/{front.session['session_id']}")
    await _refused(front, _encode(_call_headers(front), _call_body()), status=403, code="invalid_session")


async def test_an_envelope_from_another_daemon_is_refused(front: Front, other_daemon: Daemon) -> None:
    # The other daemon's own route token with its own session's envelope would pass there; here, our
    # route token passes and only the foreign envelope is wrong.
    foreign = await other_daemon.new_session()
    headers = _replaced(_call_headers(front), "X-Sidecar-Context", foreign["headers"]["X-Sidecar-Context"])
    await _refused(front, _encode(headers, _call_body()), status=403, code="invalid_session")


async def test_a_route_token_from_another_daemon_is_refused(front: Front, other_daemon: Daemon) -> None:
    foreign = await other_daemon.new_session()
    headers = _replaced(_call_headers(front), "Authorization", foreign["headers"]["Authorization"])
    await _refused(front, _encode(headers, _call_body()), status=401, code="unauthorized")


# --- contract §4: an MCP transport session belongs to the sidecar session that opened it ----------------


def _headers_2025(front: Front, *, transport_id: str | None = None) -> Headers:
    headers = _without(_without(_without(_call_headers(front), "MCP-Protocol-Version"), "Mcp-Method"), "Mcp-Name")
    if transport_id is not None:
        headers += [("Mcp-Session-Id", transport_id), ("MCP-Protocol-Version", PROTOCOL_2025)]
    return headers


def _message_2025(method: str, params: dict[str, Any], *, message_id: int | None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if message_id is not None:
        message["id"] = message_id
    return json.dumps(message).encode()


@pytest_asyncio.fixture(loop_scope="module")
async def opened_transport(front: Front) -> str:
    """A 2025-era MCP transport session opened (initialize + initialized) by ``front``'s session."""
    initialize = _message_2025(
        "initialize",
        {"protocolVersion": PROTOCOL_2025, "capabilities": {}, "clientInfo": {"name": "a", "version": "0"}},
        message_id=1,
    )
    opened = await _send(front.port, _encode(_headers_2025(front), initialize))
    assert opened.status == 200, opened
    transport_id = opened.headers["mcp-session-id"]
    initialized = _message_2025("notifications/initialized", {}, message_id=None)
    acked = await _send(front.port, _encode(_headers_2025(front, transport_id=transport_id), initialized))
    assert acked.status == 202, acked
    return transport_id


_CALL_2025: Final = _message_2025("tools/call", {"name": "calculate", "arguments": {"expression": "1+1"}}, message_id=2)


@pytest.mark.parametrize(
    ("method", "body"),
    [
        pytest.param("POST", _CALL_2025, id="tools-call"),
        pytest.param("GET", b"", id="open-the-stream"),
        pytest.param("DELETE", b"", id="terminate"),
    ],
)
async def test_a_transport_session_is_refused_to_another_sidecar_session(
    front: Front, opened_transport: str, method: str, body: bytes
) -> None:
    intruder = Front(front.daemon, await front.daemon.new_session())
    hijack = _encode(_headers_2025(intruder, transport_id=opened_transport), body, method=method)
    # The SDK's own answer for a transport session its caller does not own: 404, JSON-RPC -32600.
    await _refused(intruder, hijack, status=404, code="-32600")

    # Control: the transport is still alive, and the same call by the session that opened it runs the tool.
    owned = await _send(front.port, _encode(_headers_2025(front, transport_id=opened_transport), _CALL_2025))
    assert owned.status == 200, owned
    assert _sse_or_json(owned)["id"] == 2
    assert (len(front.tool_calls()), intruder.tool_calls()) == (1, [])


# --- contract §4 on the REST facade: the same credentials guard the other way to run a tool ---------------


def _rest_invoke(headers: Headers, *, target: str = "/api/v1/mcp/tools/calculate/invoke") -> bytes:
    rest_headers = _without(_without(_without(headers, "MCP-Protocol-Version"), "Mcp-Method"), "Mcp-Name")
    return _encode(rest_headers, b'{"arguments":{"expression":"1+1"}}', target=target)


async def test_the_rest_facade_runs_the_tool_with_valid_credentials(front: Front) -> None:
    reply = await _send(front.port, _rest_invoke(_call_headers(front)))
    assert reply.status == 200, reply
    assert reply.json()["status"] == "ok"
    assert [c["via"] for c in front.tool_calls()] == ["rest"]


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        pytest.param("no-token", 401, "unauthorized", id="no-token"),
        pytest.param("query-token", 401, "unauthorized", id="query-token"),
        pytest.param("no-envelope", 403, "invalid_session", id="no-envelope"),
        pytest.param("foreign-host", 403, "host_not_allowed", id="foreign-host"),
        pytest.param("cross-site", 403, "cross_site_request", id="cross-site"),
    ],
)
async def test_the_rest_facade_refuses_what_mcp_refuses(front: Front, change: str, status: int, code: str) -> None:
    valid = _call_headers(front)
    target = "/api/v1/mcp/tools/calculate/invoke"
    if change == "no-token":
        headers = _without(valid, "Authorization")
    elif change == "query-token":
        headers, target = _without(valid, "Authorization"), f"{target}?access_token={front.token}"
    elif change == "no-envelope":
        headers = _without(valid, "X-Sidecar-Context")
    elif change == "foreign-host":
        headers = _replaced(valid, "Host", "evil.example.com")
    else:
        headers = _plus(valid, "Sec-Fetch-Site", "cross-site")
    await _refused(front, _rest_invoke(headers, target=target), status=status, code=code)


# --- the control API and /healthz ---------------------------------------------------------------------


@pytest.mark.parametrize("credential", ["none", "route-token", "wrong", "basic"])
async def test_the_control_api_refuses_anything_but_the_control_token(front: Front, credential: str) -> None:
    headers: Headers = [("Host", f"127.0.0.1:{front.port}"), ("Content-Type", "application/json")]
    authorization = {
        "none": None,
        "route-token": f"Bearer {front.token}",
        "wrong": f"Bearer {'A' * 43}",
        "basic": f"Basic {front.daemon.control_token}",
    }[credential]
    if authorization is not None:
        headers.append(("Authorization", authorization))
    # A session create would write a session.created record if it got through.
    body = json.dumps({"workspace": str(front.daemon.workspace)}).encode()
    sessions_before = await front.daemon.control("GET", "/control/sessions")
    await _refused(front, _encode(headers, body, target="/control/sessions"), status=401, code="unauthorized")
    assert await front.daemon.control("GET", "/control/sessions") == sessions_before


async def test_the_control_api_refuses_the_control_token_in_the_url(front: Front) -> None:
    headers: Headers = [("Host", f"127.0.0.1:{front.port}")]
    target = f"/control/routes/connector-proxy/rotate?token={front.daemon.control_token}"
    await _refused(front, _encode(headers, b"", target=target), status=401, code="unauthorized")


async def test_the_control_api_applies_the_host_guard_first(front: Front) -> None:
    headers: Headers = [
        ("Host", "evil.example.com"),
        ("Authorization", f"Bearer {front.daemon.control_token}"),
    ]
    request = _encode(headers, b"", target="/control/routes/connector-proxy/rotate")
    await _refused(front, request, status=403, code="host_not_allowed")


async def test_healthz_applies_the_host_guard(front: Front) -> None:
    request = _encode([("Host", "evil.example.com")], b"", method="GET", target="/healthz")
    await _refused(front, request, status=403, code="host_not_allowed")


async def test_healthz_answers_without_a_token_and_says_nothing_else(front: Front) -> None:
    before = front.daemon.audit_bytes()
    reply = await _send(
        front.port, _encode([("Host", f"localhost:{front.port}")], b"", method="GET", target="/healthz")
    )
    assert reply.status == 200, reply
    assert reply.json() == {"status": "ok"}
    assert reply.body == b'{"status":"ok"}'
    assert "access-control-allow-origin" not in reply.headers
    assert front.daemon.audit_bytes() == before


# --- contract §3: bounded bodies ------------------------------------------------------------------------


async def test_a_body_declared_over_the_size_limit_is_refused(front: Front) -> None:
    limit = Settings().limits.max_body_bytes
    assert limit == 4 * 1024 * 1024
    request = _encode(_call_headers(front), b"", content_length=limit + 1)
    await _refused(front, request, status=413, code="body_too_large", send=_send_read_one)


async def test_a_streamed_body_over_the_size_limit_is_refused(front: Front) -> None:
    # No Content-Length to refuse up front: the limit must hold while the body is being read.
    limit = Settings().limits.max_body_bytes
    body = _call_body(pad="x" * limit)
    assert len(body) > limit
    request = _encode(_call_headers(front), body, chunked=True)
    await _refused(front, request, status=413, code="body_too_large", send=_send_read_one)


async def test_json_nested_too_deep_is_refused(front: Front) -> None:
    deep = "[" * 100 + "]" * 100
    body = _call_body().replace(b'"expression":"1+1"', b'"expression":"1+1","x":' + deep.encode())
    assert body.count(b"[") == 100
    await _refused(front, _encode(_call_headers(front), body), status=400, code="body_too_deep")


# --- contract §3: no CORS, ever -------------------------------------------------------------------------


async def test_a_cors_preflight_gets_no_cors_headers(front: Front) -> None:
    headers: Headers = [
        ("Host", f"127.0.0.1:{front.port}"),
        ("Origin", ALLOWED_LOOKING_ORIGIN),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "authorization, x-sidecar-context, content-type"),
    ]
    before = front.daemon.audit_bytes()
    reply = await _send(front.port, _encode(headers, b"", method="OPTIONS", target="/mcp"))
    assert reply.status == 403, reply
    assert not [h for h in reply.headers if h.startswith("access-control-")], reply.headers
    assert front.daemon.audit_bytes() == before


@pytest_asyncio.fixture(loop_scope="module")
async def daemon_allowing_an_origin(tmp_path: Path, workspace: Path) -> AsyncIterator[Daemon]:
    root = tmp_path / "origin-home"
    paths = Paths(config=root / "config", state=root / "state", data=root / "data")
    settings = Settings(allowed_origins=(ALLOWED_LOOKING_ORIGIN,))
    async with running_daemon(paths, workspace, settings) as allowing:
        yield allowing


async def test_an_allowed_origin_still_gets_no_cors_headers(daemon_allowing_an_origin: Daemon) -> None:
    front = Front(daemon_allowing_an_origin, await daemon_allowing_an_origin.new_session())
    headers = _plus(_call_headers(front), "Origin", ALLOWED_LOOKING_ORIGIN)
    reply = await _send(front.port, _encode(headers, _call_body()))
    assert reply.status == 200, reply  # the origin is allowed: the call goes through ...
    assert not [h for h in reply.headers if h.startswith("access-control-")], reply.headers  # ... no CORS


# --- contract §3: one strict JSON reading of every body -----------------------------------------------

_TWICE_AT_THE_TOP = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call",',
    b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call",',
)


@pytest.mark.parametrize(
    ("original", "changed"),
    [
        pytest.param(*_TWICE_AT_THE_TOP, id="method-twice"),
        pytest.param(
            b'"params":{"name":"calculate",', b'"params":{"name":"tool_search","name":"calculate",', id="name-twice"
        ),
        pytest.param(b'"expression":"1+1"', b'"expression":"1+1","expression":"2+2"', id="argument-twice"),
        pytest.param(b'"expression":"1+1"', b'"expression":"1+1","x":NaN', id="nan"),
        pytest.param(b'"expression":"1+1"', b'"expression":"1+1","x":1e400', id="number-too-large"),
        pytest.param(b'"expression":"1+1"', b'"expression":"1+1",', id="not-json"),
    ],
)
async def test_an_mcp_body_the_strict_reader_refuses_runs_nothing(
    front: Front, original: bytes, changed: bytes
) -> None:
    body = _call_body()
    assert original in body
    reply = await _refused(
        front, _encode(_call_headers(front), body.replace(original, changed)), status=400, code="parse_error"
    )
    assert reply.json()["error"]["code"] == -32700
    assert b"tools/call" not in reply.body and b"calculate" not in reply.body, "the error quoted the body"


async def test_a_member_name_in_another_case_is_not_that_member(front: Front) -> None:
    # "Method" is not "method": the body has no method, so it is no call, whatever the SDK makes of it.
    body = _call_body().replace(b'"method":"tools/call"', b'"Method":"tools/call"')
    before = front.daemon.audit_bytes()
    reply = await _send(front.port, _encode(_call_headers(front), body))
    assert 400 <= reply.status < 500, reply
    assert not front.tool_calls(), "a call ran without a method member"
    assert front.daemon.audit_bytes() == before


async def test_a_rest_body_naming_a_member_twice_is_refused(front: Front) -> None:
    body = b'{"arguments":{"expression":"1+1"},"arguments":{"expression":"2+2"}}'
    request = _encode(_call_headers(front), body, target="/api/v1/mcp/tools/calculate/invoke")
    reply = await _refused(front, request, status=400, code="parse_error")
    assert b"expression" not in reply.body


async def test_a_control_body_naming_a_member_twice_is_refused(front: Front) -> None:
    headers: Headers = [
        ("Host", f"127.0.0.1:{front.port}"),
        ("Authorization", f"Bearer {front.daemon.control_token}"),
        ("Content-Type", "application/json"),
    ]
    workspace = json.dumps(str(front.daemon.workspace))
    body = f'{{"workspace":{workspace},"mode":"read-only","mode":"bypass"}}'.encode()
    sessions_before = await front.daemon.control("GET", "/control/sessions")
    await _refused(front, _encode(headers, body, target="/control/sessions"), status=400, code="parse_error")
    assert await front.daemon.control("GET", "/control/sessions") == sessions_before
