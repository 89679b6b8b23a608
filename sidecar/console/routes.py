"""The web console's routes: sign-in, its page and static files, and the small JSON API the page calls.

Sign-in (issue 14 item 1, issue 21 item 2): ``sidecar ui`` mints a one-time code through the control
API (``POST /control/console/code``, control token) and opens ``/ui/signin#code=…``. That page's script
drops the code from the address bar and spends it (``POST /ui/api/session``, from the daemon's own
``Origin``) for a session secret, which it keeps in ``sessionStorage``; the console's page sends it as
``X-Sidecar-Session`` on every ``/ui/api/`` call. No page the daemon serves holds a secret, and nothing
the browser sends by itself (a cookie) signs anyone in: a server on another loopback port gets nothing
to replay (``auth/console``).

Every request that changes something also needs the daemon's own ``Origin`` and a JSON body. The
network guard lets the daemon's own origin through on ``/ui`` only (and keeps refusing
``Sec-Fetch-Site: same-site`` pages, such as another loopback port's). Every ``/ui`` answer carries a
strict Content-Security-Policy (scripts, styles and fetches from this origin only, no inline script, no
frames), ``X-Frame-Options: DENY`` and ``Referrer-Policy: no-referrer``.

The actions are the control API's own: the connector service, the approval store, the session store,
``start_sign_in`` and the OAuth broker's ``revoke``; nothing is reimplemented here.
"""

from __future__ import annotations

import html
import logging
from importlib import resources
from typing import Final

from aiohttp import hdrs, web

from sidecar import control
from sidecar.appkeys import AUDIT, CONNECTORS, CONSOLE, REFUSALS, RUNTIME, SETTINGS
from sidecar.auth.console import CODE_TTL, IDLE_TTL, SESSION_TTL, ConsoleSession
from sidecar.console.views import audit_view, connector_view, overview
from sidecar.control import connector_body, start_sign_in
from sidecar.errors import Forbidden, NotFound, RequestRejected, Unauthorized, UnsupportedMediaType
from sidecar.http import json_response
from sidecar.net.body import read_json
from sidecar.net.guard import own_origins
from sidecar.oauth.flow import check_authorization_url
from sidecar.origins import parse_origin

__all__ = ["SESSION_HEADER", "SIGNIN_PATH", "UI_PREFIX", "add_console_routes", "console_url", "is_console_path"]

logger = logging.getLogger(__name__)

UI_PREFIX: Final = "/ui"
SIGNIN_PATH: Final = f"{UI_PREFIX}/signin"
"""The page the one-time link opens; it holds no secret (the code rides in the fragment, which no request
carries), so a browser may arrive there from anywhere, the private redirect file included."""
SESSION_HEADER: Final = "X-Sidecar-Session"
"""The header every ``/ui/api/`` call carries the console session's secret in."""
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""No inline script or style, nothing from another origin, never framed (issue 14 item 1)."""
_PAGE_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_STATIC: Final = {
    "console.js": "text/javascript",
    "signin.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
"""The files under ``console/static/`` the daemon serves, and their types; nothing else is served."""
_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})


def is_console_path(path: str) -> bool:
    """``/ui`` and below: where the daemon's own origin may call it (``net/guard``)."""
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def console_url(port: int) -> str:
    """Where the console is (signed in already, or ``sidecar ui`` to sign in)."""
    return f"http://127.0.0.1:{port}{UI_PREFIX}/"


def _static(name: str) -> bytes:
    return resources.files("sidecar.console").joinpath("static", name).read_bytes()


# --- who is asking ---------------------------------------------------------------------------------


def _check_change(request: web.Request) -> None:
    """A change comes from the daemon's own page: its own ``Origin``, present, and a JSON body."""
    origins = request.headers.getall(hdrs.ORIGIN, [])
    try:
        origin = parse_origin(origins[0]) if len(origins) == 1 else None
    except ValueError:
        origin = None
    # SECURITY: a change needs the daemon's own origin, present: not merely an origin the guard allows.
    if origin not in own_origins(request.app[RUNTIME].port):
        raise Forbidden("a console change must come from the console's own page (Origin)")
    # SECURITY: no HTML form can send JSON; the page always does (defence in depth behind the above).
    if request.content_type != "application/json":
        raise UnsupportedMediaType("a console change is a JSON request (Content-Type: application/json)")


def _check_api(request: web.Request) -> ConsoleSession:
    """The session secret and, for a change, the daemon's own Origin; else 401/403 before anything runs."""
    # SECURITY: a header only the console's page can send (its secret is in that origin's sessionStorage;
    # a page elsewhere cannot read it, nor send a custom header here without CORS, which is never given).
    session = request.app[CONSOLE].session(request.headers.get(SESSION_HEADER))
    if session is None:
        raise Unauthorized("not signed in to the console (or signed out, or idle too long): run sidecar ui")
    if request.method not in _SAFE_METHODS:
        _check_change(request)
    return session


# --- sign-in and the page --------------------------------------------------------------------------


async def mint_code(request: web.Request) -> web.Response:
    """``POST /control/console/code`` (control token): a one-time sign-in link, valid 60 s, once."""
    app = request.app
    code = app[CONSOLE].mint_code()
    app[AUDIT].append("console.code")
    # The code rides in the fragment: a browser never sends it to a server, nor in a Referer.
    url = f"http://127.0.0.1:{app[RUNTIME].port}{SIGNIN_PATH}#code={code}"
    return json_response({"url": url, "expires_in": int(CODE_TTL)}, headers={"Cache-Control": "no-store"})


async def signin_page(request: web.Request) -> web.Response:
    """The sign-in page: no secret in it; its script spends the code from its own address's fragment."""
    return _page(
        "Signing in to the sidecar console",
        "Signing in… If nothing happens, the link was used already or has expired (links live 60 seconds and "
        "work once): run sidecar ui again for a new one.",
        status=200,
        script="signin.js",
    )


async def api_session(request: web.Request) -> web.Response:
    """``POST /ui/api/session`` ``{"code"}`` from the sign-in page: spend the code for a session secret."""
    _check_change(request)
    app = request.app
    _, body = await read_json(request, app[SETTINGS].limits)
    code = body.get("code") if isinstance(body, dict) else None
    if not isinstance(code, str):
        raise RequestRejected('send {"code": "<the code from the sign-in link>"}')
    secret = app[CONSOLE].exchange(code)
    if secret is None:
        app[REFUSALS].count("console", "signin_refused")  # one record a minute, never one per try
        raise Forbidden("this sign-in link was used already or has expired: run sidecar ui again")
    app[AUDIT].append("console.signin")
    return json_response(
        {"secret": secret, "expires_in": int(SESSION_TTL), "idle_timeout": int(IDLE_TTL)},
        headers={"Cache-Control": "no-store"},
    )


async def signout(request: web.Request) -> web.Response:
    """End the session server-side: its secret is worthless from now on, wherever it was copied to."""
    _check_api(request)
    request.app[CONSOLE].sign_out(request.headers.get(SESSION_HEADER))
    return json_response({"signed_out": True})


async def index(request: web.Request) -> web.Response:
    """The console's page, the same for everyone: it holds no secret (its script brings the session)."""
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8")


async def redirect_index(request: web.Request) -> web.Response:
    return web.Response(status=303, headers={hdrs.LOCATION: f"{UI_PREFIX}/"})


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    content_type = _STATIC.get(name)
    if content_type is None:
        raise NotFound("no such console file")
    return web.Response(body=_static(name), content_type=content_type)


def _page(title: str, message: str, *, status: int, script: str | None = None) -> web.Response:
    """A plain page for the browser: the sign-in page (with its one script file), never a secret."""
    tag = f'<script src="{UI_PREFIX}/static/{script}" defer></script>' if script else ""
    body = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<title>{html.escape(title)}</title><link rel="stylesheet" href="{UI_PREFIX}/static/console.css">'
        f'<link rel="icon" href="{UI_PREFIX}/static/favicon.svg">{tag}</head>'
        f'<body><main class="notice"><h1>{html.escape(title)}</h1><p id="notice">{html.escape(message)}</p>'
        "</main></body></html>\n"
    )
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


# --- the API the page calls ------------------------------------------------------------------------


async def api_overview(request: web.Request) -> web.Response:
    _check_api(request)
    return json_response(overview(request.app))


async def api_connector(request: web.Request) -> web.Response:
    _check_api(request)
    return json_response(await connector_view(request.app, request.match_info["connector_id"]))


async def api_audit(request: web.Request) -> web.Response:
    _check_api(request)
    query = request.query
    found = await audit_view(request.app, session=query.get("session") or None, tool=query.get("tool") or None)
    return json_response(found)


async def api_connector_action(request: web.Request) -> web.Response:
    _check_api(request)
    app, connector_id, action = request.app, request.match_info["connector_id"], request.match_info["action"]
    service = app[CONNECTORS]
    if action == "trust":
        service.manager.refresh()  # what the user saw in the Trust view is what is on disk now
        connector = await service.trust(connector_id)
        return json_response(connector_body(app, connector, detail=True))
    if action == "untrust":
        connector = await service.untrust(connector_id)
        return json_response(connector_body(app, connector, detail=True))
    if action == "connect":
        flow = await start_sign_in(app, connector_id)
        if flow.get("authorization_url") is not None:
            # SECURITY: the start link the page opens leads there: only https (or loopback http).
            check_authorization_url(str(flow["authorization_url"]))
        return json_response(flow, headers={"Cache-Control": "no-store"})
    if action == "revoke":
        return await control.revoke_connector(request)
    raise NotFound("no such connector action")


async def api_approval(request: web.Request) -> web.Response:
    _check_api(request)
    return await control.get_approval(request)


async def api_approval_allow(request: web.Request) -> web.Response:
    _check_api(request)
    return await control.allow_approval(request)


async def api_approval_deny(request: web.Request) -> web.Response:
    _check_api(request)
    return await control.deny_approval(request)


async def api_session_end(request: web.Request) -> web.Response:
    _check_api(request)
    return await control.end_session(request)


async def _console_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every ``/ui`` answer, errors included, gets the page headers."""
    if is_console_path(request.path):
        for name, value in _PAGE_HEADERS.items():
            response.headers[name] = value
        response.headers.setdefault("Cache-Control", "no-store")


def add_console_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/control/console/code", mint_code)
    r.add_get(UI_PREFIX, redirect_index)
    r.add_get(f"{UI_PREFIX}/", index)
    r.add_get(SIGNIN_PATH, signin_page)
    r.add_post(f"{UI_PREFIX}/api/session", api_session)
    r.add_post(f"{UI_PREFIX}/api/signout", signout)
    r.add_get(f"{UI_PREFIX}/static/{{name}}", static)
    r.add_get(f"{UI_PREFIX}/api/overview", api_overview)
    r.add_get(f"{UI_PREFIX}/api/audit", api_audit)
    r.add_get(f"{UI_PREFIX}/api/connectors/{{connector_id}}", api_connector)
    r.add_post(f"{UI_PREFIX}/api/connectors/{{connector_id}}/{{action}}", api_connector_action)
    r.add_get(f"{UI_PREFIX}/api/approvals/{{approval_id}}", api_approval)
    r.add_post(f"{UI_PREFIX}/api/approvals/{{approval_id}}/allow", api_approval_allow)
    r.add_post(f"{UI_PREFIX}/api/approvals/{{approval_id}}/deny", api_approval_deny)
    r.add_post(f"{UI_PREFIX}/api/sessions/{{session_id}}/end", api_session_end)
    app.on_response_prepare.append(_console_headers)
