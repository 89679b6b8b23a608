"""The web console in a real browser (issue 14): Debian's Chromium, driven by Playwright for Python.

Each test runs a real daemon on 127.0.0.1:0 and a headless Chromium with a fresh profile, signs in with
a one-time link as ``sidecar ui`` would open it, and clicks what a person clicks; the effects are seen
where they matter: an MCP SDK client's calls, the control API, the audit log. The attacker's page is
served from another loopback port in the same browser, signed in to the console. Every console page is
watched for console errors and failed scripts (none allowed), and the tests take a screenshot of each
view: ``SIDECAR_SCREENSHOTS=1`` saves them into ``docs/screenshots/`` for the README.

Chromium must be Debian's ``/usr/bin/chromium`` (``scripts/test`` installs it when it can; never
``playwright install``). Without it these tests are skipped, except in CI, where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
from aiohttp import web

from sidecar.bus.approvals import MAX_VALUE_SHOWN
from tests.browsers import CHROMIUM, CHROMIUM_FLAGS
from tests.conftest import Daemon, mcp_client
from tests.helpers import ECHO_SERVER, python_server, tool_text, trust, wait_until, write_user_servers

playwright_api = pytest.importorskip("playwright.async_api")

pytestmark = pytest.mark.slow  # Chromium and Playwright's driver are processes

SCREENSHOTS: Final = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
"""Where the README's screenshots live; the tests write them there with ``SIDECAR_SCREENSHOTS=1`` (every
run takes them, but each differs in ports, paths and times: a plain run keeps the checkout clean)."""
STEP: Final = 15_000
"""Milliseconds one browser step may take (a click, a row to appear); a bound, never a measurement."""

if not shutil.which(CHROMIUM):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing: CI must install Debian's chromium (scripts/test does)")
    pytest.skip(f"{CHROMIUM} is not installed (Debian package chromium)", allow_module_level=True)


class Watched:
    """A console page and the errors it logged: console errors and uncaught exceptions."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as driver:
        chromium = await driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@contextlib.asynccontextmanager
async def console(browser: Any, daemon: Daemon) -> AsyncIterator[Watched]:
    """A fresh browser context signed in to the console through a one-time link; no console errors."""
    context = await browser.new_context(viewport={"width": 1180, "height": 640})
    try:
        watched = Watched(await context.new_page())
        minted = await daemon.control("POST", "/control/console/code")
        response = await watched.page.goto(minted["url"])
        assert response is not None and response.status == 200
        await watched.page.wait_for_url(f"{daemon.url}/ui/", timeout=STEP)  # the code is gone from the address bar
        await playwright_api.expect(watched.page.locator("#version")).to_have_text("0.1.0", timeout=STEP)
        yield watched
        assert watched.errors == []
    finally:
        await context.close()


async def show(watched: Watched, view: str) -> None:
    await watched.page.click(f'nav a[data-view="{view}"]')
    await playwright_api.expect(watched.page.locator(f"#view-{view}")).to_be_visible(timeout=STEP)


async def screenshot(watched: Watched, name: str) -> None:
    image = await watched.page.screenshot()
    assert image.startswith(b"\x89PNG")
    if os.environ.get("SIDECAR_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / f"{name}.png").write_bytes(image)


async def test_the_one_time_link_signs_in_once(browser: Any, daemon: Daemon) -> None:
    async with console(browser, daemon) as watched:
        # The session is this tab's sessionStorage, this origin's only: no cookie, nothing in the page.
        assert await watched.page.context.cookies() == []
        secret = await watched.page.evaluate("sessionStorage.getItem('sidecar-session')")
        assert isinstance(secret, str) and len(secret) == 43
        assert secret not in await watched.page.content()
    context = await browser.new_context()
    try:
        page = await context.new_page()
        minted = await daemon.control("POST", "/control/console/code")
        first = await page.goto(minted["url"])
        assert first is not None and first.status == 200
        await page.wait_for_url(f"{daemon.url}/ui/", timeout=STEP)
        other = await (await browser.new_context()).new_page()
        await other.goto(minted["url"])  # the same link, in another browser profile
        await playwright_api.expect(other.locator("#notice")).to_contain_text(
            "used already or has expired", timeout=STEP
        )
        assert other.url == f"{daemon.url}/ui/signin"  # the code left the address bar all the same
        assert await other.evaluate("sessionStorage.getItem('sidecar-session')") is None
        await other.context.close()
    finally:
        await context.close()


async def test_trusting_a_connector_in_the_console_makes_its_tools_callable(browser: Any, daemon: Daemon) -> None:
    write_user_servers(daemon, {"echo": python_server(ECHO_SERVER)})
    session = await daemon.new_session(allow=["mcp__echo__*"], mode="bypass")  # its tools are MEDIUM
    async with mcp_client(session) as client:
        before = await client.call_tool("mcp__echo__echo", {"text": "hi"})
    assert before.is_error  # configured, not trusted: not there
    async with console(browser, daemon) as watched:
        row = watched.page.locator('tr[data-connector="echo"]')
        await playwright_api.expect(row.locator(".state")).to_have_text("configured", timeout=STEP)
        await row.get_by_role("button", name="Review trust").click()
        panel = watched.page.locator("#trust-panel")
        await playwright_api.expect(panel).to_contain_text(str(ECHO_SERVER), timeout=STEP)  # what will run
        await playwright_api.expect(panel).to_contain_text("echo::", timeout=STEP)  # the trust key
        await screenshot(watched, "trust")
        await panel.get_by_role("button", name="Trust").click()
        await playwright_api.expect(row.locator(".state")).to_have_text("trusted", timeout=STEP)
        await playwright_api.expect(row).to_contain_text("mcp__echo__echo", timeout=STEP)
        await screenshot(watched, "connectors")
        async with mcp_client(session) as client:
            after = await client.call_tool("mcp__echo__echo", {"text": "hi"})
        assert not after.is_error and tool_text(after) == "hi"
        assert [r["name"] for r in daemon.audit_events("trust.granted")] == ["echo"]

        # Its config changes behind the user's back: the console says what changed before re-trusting.
        write_user_servers(daemon, {"echo": python_server(ECHO_SERVER, "--extra")})
        await playwright_api.expect(row.locator(".state")).to_have_text("changed", timeout=STEP)
        await row.get_by_role("button", name="Review trust").click()
        await playwright_api.expect(panel).to_contain_text("Changed since you trusted it", timeout=STEP)
        await playwright_api.expect(panel.locator("li")).to_have_text(
            [f'args: ["{ECHO_SERVER}"] -> ["{ECHO_SERVER}", "--extra"]'], timeout=STEP
        )
        await screenshot(watched, "changed")
        await panel.get_by_role("button", name="Cancel").click()
    async with mcp_client(session) as client:
        withheld = await client.call_tool("mcp__echo__echo", {"text": "hi"})
    assert withheld.is_error  # nothing changed runs until trusted again


async def test_granting_a_pending_approval_runs_the_waiting_call_once(browser: Any, daemon: Daemon) -> None:
    session = await daemon.new_session(project="billing-demo")
    async with console(browser, daemon) as watched:
        await show(watched, "approvals")
        async with mcp_client(session) as client:
            waiting = await client.call_tool("note_save", {"text": "ship it <b>today</b>"})
            assert waiting.is_error and "sidecar approvals allow ap_" in tool_text(waiting)
            assert f"{daemon.url}/ui/" in tool_text(waiting)
            row = watched.page.locator("#approvals tr")
            # Appears without a reload: the page polls.
            await playwright_api.expect(row).to_have_count(1, timeout=STEP)
            await playwright_api.expect(row).to_contain_text("note_save", timeout=STEP)
            await playwright_api.expect(row).to_contain_text("MEDIUM")
            await playwright_api.expect(row).to_contain_text("billing-demo")
            arguments = row.locator("dl.arguments")
            await playwright_api.expect(arguments.locator("dt")).to_have_text(["text"])
            await playwright_api.expect(arguments.locator("dd")).to_have_text(['"ship it <b>today</b>"'])
            assert await arguments.locator("b").count() == 0  # shown as text, never as markup
            await playwright_api.expect(watched.page.locator("#approval-count")).to_have_text("1")
            await screenshot(watched, "approvals")
            await row.get_by_role("button", name="Allow once").click()
            await playwright_api.expect(row).to_have_count(0, timeout=STEP)
            ran = await client.call_tool("note_save", {"text": "ship it <b>today</b>"})
            again = await client.call_tool("note_save", {"text": "ship it <b>today</b>"})
            notes = await client.call_tool("notes_read", {})
    assert not ran.is_error and again.is_error  # allowed once: the waiting call ran once
    assert tool_text(notes).count("ship it") == 1
    assert [r["event"] for r in daemon.audit_events() if r["event"].startswith("approval.")] == [
        "approval.requested",
        "approval.allowed",
        "approval.used",
        "approval.requested",
    ]


async def test_a_long_argument_is_bounded_on_its_own_and_revealed_on_request(browser: Any, daemon: Daemon) -> None:
    await trust(daemon, "workspace")
    session = await daemon.new_session(allow=["mcp__workspace__*"])
    long = "B" * 5000
    async with console(browser, daemon) as watched:
        await show(watched, "approvals")
        async with mcp_client(session) as client:
            await client.call_tool("mcp__workspace__write_file", {"content": long, "path": "plan.txt"})
        arguments = watched.page.locator("#approvals tr dl.arguments")
        await playwright_api.expect(arguments.locator("dt")).to_have_text(["path", "content"], timeout=STEP)
        values = arguments.locator("dd code")
        await playwright_api.expect(values.nth(0)).to_have_text('"plan.txt"')
        more = f"… {len(long) + 2 - MAX_VALUE_SHOWN} more characters"
        await playwright_api.expect(arguments.get_by_role("button")).to_have_text([more])
        await playwright_api.expect(values.nth(1)).to_have_text(('"' + long)[:MAX_VALUE_SHOWN])
        await screenshot(watched, "approval-long-argument")
        await arguments.get_by_role("button", name=more).click()
        await playwright_api.expect(values.nth(1)).to_have_text(f'"{long}"', timeout=STEP)
        await playwright_api.expect(arguments.get_by_role("button")).to_have_count(0)
    assert not (daemon.workspace / "plan.txt").exists()


async def test_ending_a_session_in_the_console_refuses_its_clients_next_call(browser: Any, daemon: Daemon) -> None:
    session = await daemon.new_session(project="to-end", label="my agent")
    kept = await daemon.new_session(project="to-keep")
    async with console(browser, daemon) as watched:
        await show(watched, "sessions")
        async with mcp_client(session) as client:
            assert tool_text(await client.call_tool("calculate", {"expression": "6*7"})) == "42"
            row = watched.page.locator(f'tr[data-session="{session["session_id"]}"]')
            cells = row.locator("td")
            await playwright_api.expect(cells.nth(9)).to_have_text("1", timeout=STEP)  # its connection
            await playwright_api.expect(cells.nth(0)).to_contain_text("my agent")
            await playwright_api.expect(cells.nth(1)).to_have_text(re.compile(r"^mcp \S+$"))  # the SDK's clientInfo
            await playwright_api.expect(cells.nth(7)).not_to_have_text("not since start")
            await screenshot(watched, "sessions")
            # End asks first: dismissed, nothing ends; accepted, the session does.
            asked: list[str] = []

            async def answer(dialog: Any, accept: bool) -> None:
                asked.append(dialog.message)
                await (dialog.accept() if accept else dialog.dismiss())

            watched.page.once("dialog", lambda dialog: asyncio.ensure_future(answer(dialog, False)))
            await row.get_by_role("button", name="End").click()
            await wait_until(lambda: bool(asked), timeout=STEP / 1000)
            assert session["session_id"] in asked[0] and "to-end" in asked[0] and "my agent" in asked[0]
            assert tool_text(await client.call_tool("calculate", {"expression": "6*7"})) == "42"  # still alive
            watched.page.once("dialog", lambda dialog: asyncio.ensure_future(answer(dialog, True)))
            await row.get_by_role("button", name="End").click()
            await playwright_api.expect(row).to_have_count(0, timeout=STEP)
            with pytest.raises(Exception) as refused:  # whatever the SDK raises for the refusal it got
                await client.call_tool("calculate", {"expression": "6*7"})
        await playwright_api.expect(watched.page.locator(f'tr[data-session="{kept["session_id"]}"]')).to_have_count(1)
        await show(watched, "audit")
        await playwright_api.expect(watched.page.locator("#audit-verify")).to_contain_text(
            "chain verified", timeout=STEP
        )
        await watched.page.fill("#audit-session", session["session_id"])
        await watched.page.click("#audit-filter button")
        await playwright_api.expect(watched.page.locator("#audit tr").first).to_contain_text(
            "session.ended", timeout=STEP
        )
        await screenshot(watched, "audit")
    assert refused.value is not None
    async with httpx2.AsyncClient(headers=session["headers"], timeout=15) as http:
        answer = await http.post(session["url"], json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 403  # the envelope names an ended session
    assert [s["session_id"] for s in (await daemon.control("GET", "/control/sessions"))["sessions"]] == [
        kept["session_id"]
    ]


async def test_the_audit_view_wraps_long_details_instead_of_overflowing_the_page(browser: Any, daemon: Daemon) -> None:
    # A project id may be 128 characters with no space or hyphen: one unbroken word in its audit record.
    allow = [f"mcp__connector-with-a-long-name-{n}__*" for n in range(12)]
    await daemon.new_session(project="acme_corp.platform_team." + "quarterly_report_generator_svc." * 3, allow=allow)
    async with console(browser, daemon) as watched:
        await show(watched, "audit")
        await playwright_api.expect(watched.page.locator("#audit tr").first).to_be_visible(timeout=STEP)
        await playwright_api.expect(watched.page.locator("#audit")).to_contain_text(allow[0], timeout=STEP)
        await watched.page.set_viewport_size({"width": 1280, "height": 640})
        overflow = await watched.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page scrolls sideways by {overflow}px"


ATTACKER_PAGE: Final = """<!doctype html><html><body>
<iframe id="framed" src="{daemon}/ui/"></iframe>
<iframe name="sink"></iframe>
<form id="form" method="post" action="{daemon}/ui/api/approvals/{approval}/allow" target="sink" enctype="text/plain">
<input name='{{"remember":null,"x":"' value='"}}'></form>
<script>
window.results = [];
async function attempt(name, init) {{
  try {{
    const r = await fetch("{daemon}/ui/api/" + name, Object.assign({{credentials: "include"}}, init));
    window.results.push(name + ":" + r.status);
  }} catch (e) {{ window.results.push(name + ":blocked"); }}
}}
(async () => {{
  await attempt("approvals/{approval}/allow", {{method: "POST", mode: "no-cors", body: "{{}}"}});
  const json = {{"Content-Type": "application/json", "X-Sidecar-Session": "guess"}};
  await attempt("approvals/{approval}/allow", {{method: "POST", headers: json, body: "{{}}"}});
  await attempt("sessions/{session}/end", {{method: "POST", mode: "no-cors", body: "{{}}"}});
  await attempt("overview", {{}});
  document.getElementById("form").submit();
  window.done = true;
}})();
</script></body></html>"""


@contextlib.asynccontextmanager
async def attacker_site(page: str) -> AsyncIterator[str]:
    """Another web server on loopback (another port: same site, another origin) serving ``page``."""

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def test_a_page_on_another_loopback_port_can_neither_act_nor_frame_the_console(
    browser: Any, daemon: Daemon
) -> None:
    session = await daemon.new_session()
    async with mcp_client(session) as client:
        assert (await client.call_tool("note_save", {"text": "x"})).is_error
    (approval,) = (await daemon.control("GET", "/control/approvals"))["approvals"]
    async with console(browser, daemon) as watched:  # the user is signed in, in this very browser
        page = await watched.page.context.new_page()
        before = len(daemon.audit_events())
        html = ATTACKER_PAGE.format(daemon=daemon.url, approval=approval["approval_id"], session=session["session_id"])
        async with attacker_site(html) as url:
            await page.goto(url)
            await page.wait_for_function("window.done === true", timeout=STEP)
            await page.wait_for_load_state("load")
            results = await page.evaluate("window.results")
            framed = [f for f in page.frames if f != page.main_frame]
            assert len(framed) == 2
            for frame in framed:
                assert await frame.locator("#version").count() == 0  # the console never renders framed
        # The page learns nothing: every fetch fails for it (no CORS; Cross-Origin-Resource-Policy stops
        # even no-cors ones, which would otherwise give an opaque status 0); what reached the daemon was
        # refused there (tests/security/test_console.py covers each rule alone).
        assert len(results) == 4 and all(r.endswith((":blocked", ":0")) for r in results), results
        assert results[1].endswith(":blocked") and results[3].endswith(":blocked"), results  # CORS: no answer
        await page.close()
    (still,) = (await daemon.control("GET", "/control/approvals"))["approvals"]
    assert still["state"] == "pending"
    assert session["session_id"] in [
        s["session_id"] for s in (await daemon.control("GET", "/control/sessions"))["sessions"]
    ]
    done = [r for r in daemon.audit_events()[before:] if r["event"].startswith(("approval.", "session.", "trust"))]
    assert done == []
