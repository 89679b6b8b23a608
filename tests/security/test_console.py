"""The web console's front door (issue 14 item 1, issue 21 item 2): one-time sign-in, the session
secret in a header, and the own origin.

A real daemon on 127.0.0.1:0 in this process, driven over HTTP as a browser would (headers set by hand,
so each rule can be broken alone). Every refusal asserts its status and that nothing happened: the
approval is still pending, the session still alive, nothing audited as done. What the browser sends by
itself (a cookie, from any page on any loopback port) signs nobody in: only the secret the console's
own page keeps in ``sessionStorage`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon, mcp_client, raw_request
from tests.helpers import HTTP_TIMEOUT, tool_text

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@dataclass
class Browser:
    """What a signed-in console page holds: the session secret (in its origin's sessionStorage)."""

    secret: str
    origin: str

    def headers(self, *, origin: str | None = "own", secret: str | None = "own") -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Sidecar-Session"] = self.secret if secret == "own" else secret
        if origin is not None:
            headers["Origin"] = self.origin if origin == "own" else origin
        return headers


async def _get(url: str, headers: Mapping[str, str] | None = None) -> tuple[int, Mapping[str, str], str, list[str]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http,
        http.get(url, headers=headers, allow_redirects=False) as response,
    ):
        return response.status, response.headers, await response.text(), response.headers.getall("Set-Cookie", [])


async def _call(
    daemon: Daemon, method: str, path: str, headers: Mapping[str, str], body: Any = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http,
        http.request(method, daemon.url + path, headers=headers, json=body) as response,
    ):
        return response.status, await response.json(content_type=None)


def _own(daemon: Daemon) -> dict[str, str]:
    return {"Origin": f"http://127.0.0.1:{daemon.port}", "Content-Type": "application/json"}


async def _spend(daemon: Daemon, url: str, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    """What the sign-in page's script does with the code in its fragment."""
    code = url.partition("#code=")[2]
    return await _call(daemon, "POST", "/ui/api/session", headers or _own(daemon), {"code": code})


async def sign_in(daemon: Daemon) -> Browser:
    minted = await daemon.control("POST", "/control/console/code")
    status, body = await _spend(daemon, minted["url"])
    assert status == 200, body
    return Browser(secret=body["secret"], origin=f"http://127.0.0.1:{daemon.port}")


async def _pending_approval(daemon: Daemon) -> tuple[dict[str, Any], str]:
    """A ``note_save`` call in a default-mode session: it asks, and leaves a pending approval."""
    session = await daemon.new_session()
    async with mcp_client(session) as client:
        result = await client.call_tool("note_save", {"text": "<b>hello</b>"})
    assert result.is_error
    (approval,) = (await daemon.control("GET", "/control/approvals"))["approvals"]
    return session, tool_text(result) + "\n" + approval["approval_id"]


async def test_the_one_time_link_signs_in_once_and_no_page_holds_a_secret(daemon: Daemon) -> None:
    minted = await daemon.control("POST", "/control/console/code")
    assert minted["expires_in"] == 60
    # The code rides in the fragment: never sent to a server, nor in a Referer.
    assert minted["url"].startswith(f"http://127.0.0.1:{daemon.port}/ui/signin#code=")
    code = minted["url"].partition("#code=")[2]

    status, _, page, cookies = await _get(minted["url"].partition("#")[0])
    assert (status, cookies) == (200, []) and code not in page and "signin.js" in page
    status, body = await _spend(daemon, minted["url"])
    assert status == 200 and body["expires_in"] == 12 * 3600 and body["idle_timeout"] == 1800
    status, _, console, cookies = await _get(f"{daemon.url}/ui/")
    assert (status, cookies) == (200, []) and body["secret"] not in console

    status, again = await _spend(daemon, minted["url"])  # the same link again
    assert status == 403 and "used already or has expired" in again["error"]["message"]
    events = [r["event"] for r in daemon.audit_events() if r["event"].startswith("console.")]
    assert events == ["console.code", "console.signin"]  # a refusal is counted (tests/security/test_refusal_audit.py)


async def test_a_made_up_code_or_none_signs_nobody_in(daemon: Daemon) -> None:
    for body in ({"code": "A" * 43}, {"code": "x" * 5000}, {}, {"code": 7}):
        status, answer = await _call(daemon, "POST", "/ui/api/session", _own(daemon), body)
        assert status in (400, 403) and "secret" not in answer, (body, answer)
    assert not [r for r in daemon.audit_events() if r["event"] == "console.signin"]


async def test_a_code_is_spent_only_from_the_consoles_own_page(daemon: Daemon) -> None:
    # A page elsewhere that learned a code (say, from a browser's command line) cannot spend it.
    for origin in (None, f"http://127.0.0.1:{daemon.port + 1}", "null"):
        minted = await daemon.control("POST", "/control/console/code")
        headers = {"Content-Type": "application/json", **({"Origin": origin} if origin else {})}
        status, answer = await _spend(daemon, minted["url"], headers)
        assert status == 403 and "secret" not in answer, (origin, answer)
    assert not daemon.audit_events("console.signin")


async def test_only_the_control_token_mints_a_link(daemon: Daemon) -> None:
    status, body = await _call(daemon, "POST", "/control/console/code", {})
    assert status == 401, body
    assert not daemon.audit_events("console.code")


async def test_the_api_without_the_secret_tells_how_to_sign_in(daemon: Daemon) -> None:
    status, body = await _call(daemon, "GET", "/ui/api/overview", {})
    assert status == 401 and "sidecar ui" in body["error"]["message"]
    _, headers, page, _ = await _get(f"{daemon.url}/ui/")
    assert headers["Content-Security-Policy"] == CSP and "console.js" in page


async def test_every_console_answer_carries_the_page_headers(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    for path, headers in (
        ("/ui/", {}),
        ("/ui/signin", {}),
        ("/ui/static/console.js", {}),
        ("/ui/api/overview", browser.headers(origin=None)),
        ("/ui/api/overview", {}),  # an error
        ("/ui/static/nothing.js", {}),
    ):
        _, answer, _, _ = await _get(daemon.url + path, headers)
        assert answer["Content-Security-Policy"] == CSP, path
        assert answer["X-Frame-Options"] == "DENY", path
        assert answer["Referrer-Policy"] == "no-referrer", path
        assert answer["X-Content-Type-Options"] == "nosniff", path
        assert "Access-Control-Allow-Origin" not in answer, path


async def test_an_approval_is_granted_with_the_secret_and_own_origin(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    session, text = await _pending_approval(daemon)
    approval_id = text.rsplit("\n", 1)[1]
    status, view = await _call(daemon, "GET", "/ui/api/overview", browser.headers(origin=None))
    assert status == 200
    (shown,) = view["approvals"]
    assert (shown["approval_id"], shown["tool"], shown["risk"], shown["kind"]) == (
        approval_id,
        "note_save",
        "MEDIUM",
        "confirm",
    )
    assert shown["project_id"] == "default" and shown["session_id"] == session["session_id"]
    assert shown["arguments"] == [{"name": "text", "value": '"<b>hello</b>"', "more": 0}]  # the page sets it as text
    status, body = await _call(daemon, "POST", f"/ui/api/approvals/{approval_id}/allow", browser.headers(), {})
    assert (status, body["state"]) == (200, "allowed"), body
    async with mcp_client(session) as client:
        ran = await client.call_tool("note_save", {"text": "<b>hello</b>"})
        again = await client.call_tool("note_save", {"text": "<b>hello</b>"})
    assert not ran.is_error and again.is_error  # allowed once: it ran once


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("no secret", 401),
        ("wrong secret", 401),
        ("the secret as a cookie", 401),
        ("no Origin", 403),
        ("another loopback port's Origin", 403),
        ("Origin null", 403),
        ("same-site fetch", 403),
        ("form post", 415),
    ],
)
async def test_a_change_without_every_proof_changes_nothing(daemon: Daemon, case: str, status: int) -> None:
    browser = await sign_in(daemon)
    session, text = await _pending_approval(daemon)
    approval_id = text.rsplit("\n", 1)[1]
    headers = {
        "no secret": browser.headers(secret=None),
        "wrong secret": browser.headers(secret="A" * 43),
        "the secret as a cookie": {
            **browser.headers(secret=None),
            "Cookie": f"sidecar_console_{daemon.port}={browser.secret}",
        },
        "no Origin": browser.headers(origin=None),
        "another loopback port's Origin": browser.headers(origin=f"http://127.0.0.1:{daemon.port + 1}"),
        "Origin null": browser.headers(origin="null"),
        "same-site fetch": {**browser.headers(), "Sec-Fetch-Site": "same-site"},
        "form post": {**browser.headers(), "Content-Type": "application/x-www-form-urlencoded"},
    }[case]
    before = len(daemon.audit_events())
    for path in (f"/ui/api/approvals/{approval_id}/allow", f"/ui/api/sessions/{session['session_id']}/end"):
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http,
            http.post(daemon.url + path, headers=headers, data=b"{}") as response,
        ):
            assert response.status == status, (case, path, await response.text())
    (approval,) = (await daemon.control("GET", "/control/approvals"))["approvals"]
    assert approval["state"] == "pending"
    assert [s["session_id"] for s in (await daemon.control("GET", "/control/sessions"))["sessions"]] == [
        session["session_id"]
    ]
    assert daemon.audit_events()[before:] == []


async def test_reading_the_console_needs_the_secret_too(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    for path in ("/ui/api/overview", "/ui/api/audit", "/ui/api/connectors/workspace"):
        status, _ = await _call(daemon, "GET", path, browser.headers(origin=None, secret=None))
        assert status == 401, path
        status, _ = await _call(daemon, "GET", path, browser.headers(origin=None))
        assert status == 200, path


async def test_the_own_origin_opens_the_console_only(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    own = {"Origin": browser.origin}
    status, _ = await _call(
        daemon, "GET", "/control/status", {**own, "Authorization": f"Bearer {daemon.control_token}"}
    )
    assert status == 403
    session = await daemon.new_session()
    status, _ = await _call(daemon, "GET", "/api/v1/mcp/tools", {**own, **session["headers"]})
    assert status == 403


async def test_a_cookie_of_any_name_or_value_neither_signs_in_nor_locks_out(daemon: Daemon) -> None:
    # Any page on loopback may set cookies for 127.0.0.1 (cookies ignore ports): none of them matters.
    browser = await sign_in(daemon)
    tossed = {"Cookie": f"sidecar_console_{daemon.port}=junk; sidecar-session=junk"}
    status, _ = await _call(daemon, "GET", "/ui/api/overview", {**browser.headers(origin=None), **tossed})
    assert status == 200
    status, _ = await _call(daemon, "GET", "/ui/api/overview", tossed)
    assert status == 401


async def test_signing_out_ends_the_session_on_the_daemon(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    status, _ = await _call(daemon, "POST", "/ui/api/signout", browser.headers())
    assert status == 200
    status, _ = await _call(daemon, "GET", "/ui/api/overview", browser.headers(origin=None))
    assert status == 401  # wherever the secret was copied to, it is worthless now


async def test_a_waiting_call_names_the_console_and_the_command(daemon: Daemon) -> None:
    _, text = await _pending_approval(daemon)
    message, approval_id = text.rsplit("\n", 1)
    assert f"sidecar approvals allow {approval_id}" in message
    assert f"http://127.0.0.1:{daemon.port}/ui/" in message and "sidecar ui" in message


@pytest.mark.parametrize("target", ["/ui/../control/status", "/ui/%2e%2e/control/status", "/ui/..%2fcontrol/status"])
async def test_a_dotted_path_does_not_carry_the_console_origin_elsewhere(daemon: Daemon, target: str) -> None:
    request = (
        f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\nOrigin: http://127.0.0.1:{daemon.port}\r\n"
        f"Authorization: Bearer {daemon.control_token}\r\nConnection: close\r\n\r\n"
    ).encode()
    status, _, body = await raw_request(daemon.port, request)
    assert status in (403, 404), body  # refused by the guard, or no such console path: never the status
    assert b'"version"' not in body


async def test_the_console_answers_as_the_control_api_does(daemon: Daemon) -> None:
    browser = await sign_in(daemon)
    status, console = await _call(daemon, "POST", "/ui/api/connectors/workspace/connect", browser.headers(), {})
    control = await daemon.control("POST", "/control/connectors/workspace/connect", expect=400)
    assert (status, console) == (400, control)  # the same refusal: a stdio connector has no sign-in
    status, console = await _call(daemon, "POST", "/ui/api/connectors/workspace/untrust", browser.headers(), {})
    assert (status, console["state"]) == (200, "configured")
    status, missing = await _call(daemon, "POST", "/ui/api/connectors/nothing/trust", browser.headers(), {})
    assert status == 404, missing
    status, _ = await _call(daemon, "POST", "/ui/api/connectors/workspace/explode", browser.headers(), {})
    assert status == 404
