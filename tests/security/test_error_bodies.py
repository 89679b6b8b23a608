"""Error bodies never echo what the request sent (issue 11 item 3).

Every refusal of the front door, driven over a raw socket against the real daemon with a value that
carries markup, a control character, 4 KiB of padding or a unique marker, must come back:

- with the status the contract names;
- as JSON with ``Content-Type: application/json`` and ``X-Content-Type-Options: nosniff``;
- inert: printable ASCII only (no control character, no raw non-ASCII), no ``<``, ``>`` or ``&`` byte
  (a value that helps the user is there as ``\\u003c``...), at most ``MAX_BODY`` bytes;
- without the marker: a refused Host, Origin, token, envelope, request target, path, method or tool
  name is named by what is wrong with it, never by its bytes;

and nothing ran, nothing was written, and ``/healthz`` still answers.
"""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
import pytest_asyncio

from tests.conftest import SHARED, Daemon
from tests.security.test_front_door import (
    Front,
    Headers,
    Reply,
    _call_body,
    _call_headers,
    _encode,
    _plus,
    _replaced,
    _send,
    _sse_or_json,
    _without,
)

pytestmark = SHARED  # one daemon for the module; each test has a session of its own

MARK: Final = "zq7mark"
"""A string no answer would contain unless it echoed the request."""
SCRIPT: Final = f"<script>{MARK}</script>"
PADDING: Final = "a" * 4096
MAX_BODY: Final = 2048
"""Bytes of any error body here: every message is a sentence or two, and nothing of 4 KiB comes back."""


def _assert_inert(reply: Reply, *, status: int, echo: bool = False) -> Any:
    """The reply is the refusal asked for, and an inert JSON error; returns the parsed body. ``echo``: the
    refused value helps the user and may come back (escaped and bounded all the same)."""
    assert reply.status == status, reply
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    assert reply.headers.get("x-content-type-options") == "nosniff", reply.headers
    assert len(reply.body) <= MAX_BODY, len(reply.body)
    assert all(0x20 <= byte < 0x7F for byte in reply.body), reply.body  # printable ASCII, nothing else
    for special in b"<>&":
        assert special not in reply.body, reply.body
    if not echo:
        assert MARK.encode() not in reply.body.lower(), reply.body
    return json.loads(reply.body)


async def _refused_inertly(front: Front, request: bytes, *, status: int) -> Any:
    """Send ``request``: an inert refusal, nothing ran or was written, and the daemon still answers."""
    daemon = front.daemon
    before = daemon.audit_bytes()
    body = _assert_inert(await _send(front.port, request), status=status)
    assert daemon.audit_bytes() == before, "a refused request changed the audit log"
    assert not front.tool_calls(), "a refused request ran a tool"
    await _assert_healthy(front)
    return body


async def _assert_healthy(front: Front) -> None:
    healthz = await _send(
        front.port, _encode([("Host", f"127.0.0.1:{front.port}")], b"", method="GET", target="/healthz")
    )
    assert (healthz.status, healthz.body) == (200, b'{"status":"ok"}'), healthz


@pytest_asyncio.fixture(loop_scope="module")
async def front(shared_daemon: Daemon) -> Front:
    return Front(shared_daemon, await shared_daemon.new_session())


# --- the network guard: the value is never echoed, only what is wrong with it ------------------------


@pytest.mark.parametrize(
    "host",
    [
        pytest.param(SCRIPT, id="markup"),
        pytest.param(f"{MARK}.{PADDING}.example:{{port}}", id="4-KiB"),
        pytest.param(f"127.0.0.1:{{port}}@{MARK}.example", id="userinfo"),
    ],
)
async def test_a_refused_host_is_not_echoed(front: Front, host: str) -> None:
    request = _encode(_replaced(_call_headers(front), "Host", host.format(port=front.port)), _call_body())
    body = await _refused_inertly(front, request, status=403)
    assert body["error"]["data"] == "host_not_allowed"
    assert "Host refused" in body["error"]["message"]  # says what is wrong ...
    assert f"127.0.0.1:{front.port}" in body["error"]["message"]  # ... and the remedy


@pytest.mark.parametrize(
    "origin",
    [
        pytest.param(f"http://{MARK}.example", id="foreign"),
        pytest.param(f"http://{SCRIPT}.example", id="markup"),
        pytest.param(f"http://{MARK}.example/{PADDING}", id="4-KiB"),
    ],
)
async def test_a_refused_origin_is_not_echoed(front: Front, origin: str) -> None:
    body = await _refused_inertly(
        front, _encode(_plus(_call_headers(front), "Origin", origin), _call_body()), status=403
    )
    assert body["error"]["data"] == "origin_not_allowed"


@pytest.mark.parametrize("site", [f"{SCRIPT}", f"cross-site, {MARK}"])
async def test_a_refused_sec_fetch_site_is_not_echoed(front: Front, site: str) -> None:
    request = _encode(_plus(_call_headers(front), "Sec-Fetch-Site", site), _call_body())
    body = await _refused_inertly(front, request, status=403)
    assert body["error"]["data"] == "cross_site_request"


async def test_a_refused_absolute_form_target_is_not_echoed(front: Front) -> None:
    request = _encode(_call_headers(front), _call_body(), target=f"http://{MARK}.example/mcp")
    body = await _refused_inertly(front, request, status=403)
    assert "absolute-form" in body["error"]["message"]


# --- credentials --------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [SCRIPT, MARK + PADDING])
async def test_a_refused_token_is_not_echoed(front: Front, token: str) -> None:
    request = _encode(_replaced(_call_headers(front), "Authorization", f"Bearer {token}"), _call_body())
    body = await _refused_inertly(front, request, status=401)
    assert body["error"]["data"] == "unauthorized"


@pytest.mark.parametrize("envelope", [SCRIPT, f"v1.{MARK}.{PADDING}.x"])
async def test_a_refused_envelope_is_not_echoed(front: Front, envelope: str) -> None:
    request = _encode(_replaced(_call_headers(front), "X-Sidecar-Context", envelope), _call_body())
    body = await _refused_inertly(front, request, status=403)
    assert body["error"]["data"] == "invalid_session"


# --- paths and methods: aiohttp's own refusals too ------------------------------------------------------


async def test_an_unknown_path_is_a_json_404_that_does_not_echo_it(front: Front) -> None:
    request = _encode([("Host", f"127.0.0.1:{front.port}")], b"", method="GET", target=f"/{SCRIPT}{PADDING}")
    body = await _refused_inertly(front, request, status=404)
    assert body == {"error": {"code": "not_found", "message": "Not Found"}}


async def test_a_method_the_route_does_not_take_is_a_json_405_that_does_not_echo_it(front: Front) -> None:
    request = _encode([("Host", f"127.0.0.1:{front.port}")], b"", method="PATCH", target="/healthz")
    before = front.daemon.audit_bytes()
    reply = await _send(front.port, request)
    body = _assert_inert(reply, status=405)
    assert front.daemon.audit_bytes() == before
    assert body == {"error": {"code": "method_not_allowed", "message": "Method Not Allowed"}}
    assert b"PATCH" not in reply.body
    assert reply.headers.get("allow") == "GET,HEAD", reply.headers  # what is allowed, not what was sent
    await _assert_healthy(front)


async def test_a_method_the_parser_does_not_know_is_a_json_400_that_does_not_echo_it(front: Front) -> None:
    request = _encode([("Host", f"127.0.0.1:{front.port}")], b"", method=MARK.upper(), target="/healthz")
    body = await _refused_inertly(front, request, status=400)
    assert body == {"error": {"code": "bad_request", "message": "malformed HTTP request"}}
    assert MARK.upper() not in json.dumps(body)


@pytest.mark.parametrize(
    ("method", "target"),
    [
        pytest.param("GET", f"/control/sessions/{SCRIPT}{PADDING}", id="session"),
        pytest.param("GET", f"/control/connectors/{SCRIPT}{PADDING}", id="connector"),
        pytest.param("POST", f"/control/routes/{SCRIPT}{PADDING}/rotate", id="route"),
        pytest.param("POST", f"/control/approvals/{SCRIPT}{PADDING}/deny", id="approval"),
    ],
)
async def test_a_control_path_naming_nothing_is_refused_inertly(front: Front, method: str, target: str) -> None:
    # These names help a user who mistyped one, so an answer may show one, escaped and cut short; the
    # 4 KiB and the markup never come back.
    headers: Headers = [("Host", f"127.0.0.1:{front.port}"), ("Authorization", f"Bearer {front.daemon.control_token}")]
    before = front.daemon.audit_bytes()
    reply = await _send(front.port, _encode(headers, b"", method=method, target=target))
    assert reply.status == 404, reply
    assert front.daemon.audit_bytes() == before, "a refused control request wrote to the audit log"
    assert reply.headers.get("x-content-type-options") == "nosniff"
    assert len(reply.body) <= 300, reply.body
    assert all(0x20 <= byte < 0x7F for byte in reply.body) and b"<" not in reply.body, reply.body
    assert PADDING[:100].encode() not in reply.body
    await _assert_healthy(front)


# --- tool names and JSON-RPC methods ---------------------------------------------------------------------


async def test_a_refused_rest_tool_name_is_not_echoed(front: Front) -> None:
    headers = _without(_without(_without(_call_headers(front), "MCP-Protocol-Version"), "Mcp-Method"), "Mcp-Name")
    request = _encode(headers, b'{"arguments":{}}', target=f"/api/v1/mcp/tools/<script>{MARK}/invoke")
    body = await _refused_inertly(front, request, status=404)
    assert body == {"error": {"code": "not_found", "message": "no such tool"}}


async def test_a_refused_mcp_tool_name_is_not_echoed(front: Front) -> None:
    message = json.loads(_call_body())
    message["params"]["name"] = SCRIPT
    headers = _replaced(_call_headers(front), "Mcp-Name", SCRIPT)
    reply = await _send(front.port, _encode(headers, json.dumps(message).encode()))
    assert reply.status == 200, reply  # a tool result, as for any tool this session may not use
    assert reply.headers.get("x-content-type-options") == "nosniff", reply.headers
    result = _sse_or_json(reply)["result"]
    assert result["isError"] is True
    assert MARK.encode() not in reply.body and b"<script>" not in reply.body, reply.body
    assert all(c["outcome"] != "ok" for c in front.tool_calls())
    await _assert_healthy(front)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"method": SCRIPT}, id="method-with-markup"),
        pytest.param({"method": MARK + PADDING}, id="4-KiB-method"),
        pytest.param({"jsonrpc": SCRIPT}, id="jsonrpc-version"),
        pytest.param({"id": {"a": SCRIPT}}, id="id-an-object"),
        pytest.param({"params": [SCRIPT]}, id="params-a-list"),
    ],
)
async def test_a_message_the_sdk_would_quote_back_is_refused_first(front: Front, change: dict[str, Any]) -> None:
    # The MCP SDK answers a message its models refuse with pydantic's report, input values included, and
    # an unknown method with the method as its error data: the daemon refuses these before the SDK.
    message = {**json.loads(_call_body()), **change}
    headers = _without(_without(_call_headers(front), "Mcp-Method"), "Mcp-Name")
    body = await _refused_inertly(front, _encode(headers, json.dumps(message).encode()), status=400)
    assert body["error"]["code"] == -32600
    assert body["error"]["message"].startswith("not a JSON-RPC 2.0 message")


async def test_a_batch_is_refused_without_echoing_it(front: Front) -> None:
    batch = json.dumps([json.loads(_call_body()), {"jsonrpc": "2.0", "method": SCRIPT}]).encode()
    headers = _without(_without(_call_headers(front), "Mcp-Method"), "Mcp-Name")
    await _refused_inertly(front, _encode(headers, batch), status=400)


# --- the parser's refusals and the renderer itself ---------------------------------------------------------


async def test_a_request_the_parser_refuses_is_an_inert_json_400(front: Front) -> None:
    request = _encode(_plus(_call_headers(front), "X-Padding", SCRIPT + "a" * 9000), _call_body())
    body = await _refused_inertly(front, request, status=400)
    assert body["error"]["code"] == "bad_request"


async def test_a_helpful_value_comes_back_escaped_and_cut_short(front: Front) -> None:
    # A session's workspace is worth naming when it does not exist: it comes back, but inert and short.
    headers: Headers = [
        ("Host", f"127.0.0.1:{front.port}"),
        ("Authorization", f"Bearer {front.daemon.control_token}"),
        ("Content-Type", "application/json"),
    ]
    body = json.dumps({"workspace": f"/{SCRIPT}/\x1b[31m{PADDING}"}).encode()
    before = front.daemon.audit_bytes()
    reply = await _send(front.port, _encode(headers, body, target="/control/sessions"))
    error = _assert_inert(reply, status=400, echo=True)["error"]
    assert "\\u003cscript\\u003e" in reply.body.decode()  # named, as JSON escapes
    assert "\x1b" not in error["message"]  # the escape arrives as the text \x1b, not as the character
    assert len(error["message"]) < 300
    assert front.daemon.audit_bytes() == before
    await _assert_healthy(front)


async def test_the_sdk_s_own_json_errors_carry_nosniff(front: Front) -> None:
    # A 2026-07-28 call whose Mcp-Method header disagrees with its body: the SDK's own 400.
    headers = _replaced(_call_headers(front), "Mcp-Method", "tools/list")
    reply = await _send(front.port, _encode(headers, _call_body()))
    assert reply.status == 400, reply
    assert reply.headers.get("x-content-type-options") == "nosniff", reply.headers
    assert reply.headers["content-type"].startswith("application/json")
    assert not front.tool_calls()
    await _assert_healthy(front)
