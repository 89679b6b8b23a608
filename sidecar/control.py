"""The control API (``/control/...``, bearer = the control token from runtime.json).

This is how the CLI and a desktop host drive the daemon: status, stop, sessions and routes. The
contract §11 documents every route. Bodies are small JSON objects validated with pydantic (unknown fields
are refused, so a typo is an error, not a silently ignored option).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar import __version__
from sidecar.appkeys import (
    APPROVALS,
    AUDIT,
    BILLING,
    CONNECTORS,
    FRONT_DOOR,
    OAUTH,
    REFUSALS,
    REGISTRY,
    ROUTES,
    RUNTIME,
    SESSIONS,
    SETTINGS,
    TRUST,
)
from sidecar.auth.owners import Owner
from sidecar.connectors.launch import LaunchContext, launch_plan
from sidecar.connectors.manager import Connector
from sidecar.errors import NotFound, RequestRejected
from sidecar.http import json_response
from sidecar.names import CONNECTOR_ID, PROXY_ROUTE, connector_grant, connector_route
from sidecar.net.body import read_json
from sidecar.oauth.binding import START_PATH
from sidecar.oauth.broker import CALLBACK_PATH, FLOW_TIMEOUT
from sidecar.oauth.signin import sign_in_provider, sign_in_remote
from sidecar.text import preview
from sidecar.validation import render_errors

__all__ = ["add_control_routes", "connector_body", "start_sign_in", "status_body", "status_header"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_B = TypeVar("_B", bound=_Body)


class NewSession(_Body):
    project: str = "default"
    workspace: str
    mode: str = "default"
    allow: list[str] | None = Field(default=None, max_length=256)
    """The grant; unset: ``[sessions] default_allow`` (the built-ins, no connector tool), or with
    ``connector`` that connector's tools (``mcp__<id>__*``)."""
    network: bool = True
    ttl: int | None = None
    connector: str | None = None
    """Give the configuration for one connector's own route (/mcp/connectors/<id>) instead of /mcp."""
    owner_pid: int | None = Field(default=None, gt=1, le=2**22)  # Linux's largest pid_max
    """A process the session ends with (``sidecar exec`` names itself): when it is gone, so is the session."""
    label: str = Field(default="", max_length=80)
    """What a person will recognise it by in ``session list``, the console and ``status``."""

    def grant(self, default: tuple[str, ...]) -> tuple[str, ...]:
        """What the session may use: the explicit ``allow``, else the connector it is for, else ``default``.
        A connector's tools are never in the grant unless someone asked for them (contract §2)."""
        if self.allow is not None:
            return tuple(self.allow)
        if self.connector is not None:
            return (connector_grant(self.connector),)
        return default


class SessionChange(_Body):
    mode: str | None = None
    allow: list[str] | None = Field(default=None, max_length=256)
    network: bool | None = None
    agent_pid: int | None = Field(default=None, gt=1, le=2**22)
    """A second process the session ends with (``sidecar exec``'s agent); once per session."""


async def _parse(request: web.Request, model: type[_B]) -> _B:
    _, data = await read_json(request, request.app[SETTINGS].limits, empty=b"{}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestRejected(render_errors(exc, source="body")) from None


def _url(app: web.Application) -> str:
    return f"http://127.0.0.1:{app[RUNTIME].port}/mcp"


async def status(request: web.Request) -> web.Response:
    return json_response(status_body(request.app))


def status_header(app: web.Application) -> dict[str, Any]:
    """The daemon itself: version, pid, url, uptime, storage security, billing and trust-store problems,
    whether connectors are sandboxed (what the web console's header shows on every poll, without the
    per-connector work of the rest)."""
    runtime = app[RUNTIME]
    return {
        "version": __version__,
        "pid": runtime.pid,
        "url": _url(app),
        "started_at": runtime.started_at,
        "uptime_seconds": round(time.time() - runtime.started_at, 1),
        "storage": {"credentials": app[OAUTH].store.describe(), "insecure": app[OAUTH].store.insecure},
        "billing_problems": app[BILLING].problems(),
        "trust_store_problem": app[TRUST].recheck(),
        "sandbox": sandbox.support.as_json() if (sandbox := app[CONNECTORS].sandbox) else None,
    }


def status_body(app: web.Application) -> dict[str, Any]:
    """What ``GET /control/status`` answers: the header, then sessions, routes, connectors, approvals."""
    header = status_header(app)
    return {
        **{key: header[key] for key in ("version", "pid", "url", "started_at", "uptime_seconds")},
        "sessions": len(app[SESSIONS].list()),
        "recent_sessions": recent_sessions(app),
        "routes": [r.name for r in app[ROUTES].list()],
        "connectors": [connector_body(app, c) for c in app[CONNECTORS].manager.list()],
        "connector_problems": [str(p) for p in app[CONNECTORS].manager.problems],
        "storage": header["storage"],
        "pending_approvals": len(app[APPROVALS].list()),
        "billing_problems": header["billing_problems"],
        "trust_store_problem": header["trust_store_problem"],
        "peer_check": app[FRONT_DOOR].describe(),
        "sandbox": header["sandbox"],
    }


def recent_sessions(app: web.Application, count: int = 5) -> list[dict[str, Any]]:
    """The sessions used last (never used: newest first), as ``status`` names them."""
    sessions = app[SESSIONS]
    described = [sessions.describe(s) for s in sessions.list()]
    described.sort(key=lambda s: (s["last_used_at"] or 0, s["created_at"]), reverse=True)
    keep = ("session_id", "label", "client", "created_at", "last_used_at")
    return [{key: s[key] for key in keep} for s in described[:count]]


async def stop(request: web.Request) -> web.Response:
    request.app[RUNTIME].request_stop()
    return json_response({"stopping": True}, status=202)


async def create_session(request: web.Request) -> web.Response:
    spec = await _parse(request, NewSession)
    app = request.app
    if spec.connector is not None and not CONNECTOR_ID.fullmatch(spec.connector):
        raise NotFound(f"no connector {spec.connector!r}")
    owner = Owner.of(spec.owner_pid) if spec.owner_pid is not None else None
    await app[SESSIONS].prepare()
    session, envelope = app[SESSIONS].create(
        project_id=spec.project,
        workspace=spec.workspace,
        mode=spec.mode,
        allow=spec.grant(app[SETTINGS].sessions.default_allow),
        network=spec.network,
        ttl=spec.ttl,
        owner=owner,
        label=spec.label,
    )
    url = _url(request.app)
    route = PROXY_ROUTE
    if spec.connector is not None:
        route = connector_route(spec.connector)
        url = f"{url}/connectors/{spec.connector}"
    if app[ROUTES].get(route) is None:
        app[SESSIONS].end(session.id)
        if spec.connector is not None:
            raise NotFound(f"connector {preview(spec.connector, 64)} is not trusted (it has no route of its own)")
        raise RequestRejected("the MCP route is not registered (daemon stopping?)")
    token = app[ROUTES].issue(route, until=session.expires_at)
    payload: dict[str, Any] = {
        "session_id": session.id,
        "url": url,
        "headers": {"Authorization": f"Bearer {token}", "X-Sidecar-Context": envelope},
        "expires_at": session.expires_at,
        "session": session.public(),
    }
    return json_response(payload, status=201, headers={"Cache-Control": "no-store"})


async def list_sessions(request: web.Request) -> web.Response:
    sessions = request.app[SESSIONS]
    return json_response({"sessions": [sessions.describe(s) for s in sessions.list()]})


async def get_session(request: web.Request) -> web.Response:
    sessions = request.app[SESSIONS]
    return json_response(sessions.describe(sessions.get(request.match_info["session_id"])))


async def change_session(request: web.Request) -> web.Response:
    change = await _parse(request, SessionChange)
    sessions, session_id = request.app[SESSIONS], request.match_info["session_id"]
    if change.agent_pid is not None:
        sessions.name_agent(session_id, Owner.of(change.agent_pid))
    session = sessions.update(session_id, mode=change.mode, allow=change.allow, network=change.network)
    return json_response(session.public())


async def end_session(request: web.Request) -> web.Response:
    aborted = request.app[SESSIONS].end(request.match_info["session_id"])
    return json_response({"ended": True, "aborted": aborted})


async def list_routes(request: web.Request) -> web.Response:
    routes = [{"name": r.name, "path": r.path, "minted_at": r.minted_at} for r in request.app[ROUTES].list()]
    return json_response({"routes": routes})


async def rotate_route(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    request.app[ROUTES].rotate(name)
    request.app[AUDIT].append("token.rotate", route=name)
    return json_response({"rotated": name})


class ApprovalGrant(_Body):
    remember: str | None = Field(default=None, pattern="^session$")
    """``"session"``: remember the approval's group for the rest of its session."""


async def list_approvals(request: web.Request) -> web.Response:
    session_id = request.query.get("session")
    pending_only = request.query.get("all") not in {"1", "true"}
    found = request.app[APPROVALS].list(session_id=session_id, pending_only=pending_only)
    return json_response({"approvals": [a.public() for a in found]})


async def get_approval(request: web.Request) -> web.Response:
    """One approval with every argument in full (a list bounds each value)."""
    return json_response(request.app[APPROVALS].get(request.match_info["approval_id"]).public(whole=True))


async def allow_approval(request: web.Request) -> web.Response:
    grant = await _parse(request, ApprovalGrant)
    approval = request.app[APPROVALS].allow(request.match_info["approval_id"], remember=grant.remember == "session")
    return json_response(approval.public())


async def deny_approval(request: web.Request) -> web.Response:
    return json_response(request.app[APPROVALS].deny(request.match_info["approval_id"]).public())


class InstallRequest(_Body):
    path: str


async def list_connectors(request: web.Request) -> web.Response:
    service = request.app[CONNECTORS]
    service.manager.refresh()
    return json_response(
        {
            "connectors": [connector_body(request.app, c) for c in service.manager.list()],
            "problems": [str(p) for p in service.manager.problems],
        }
    )


async def show_connector(request: web.Request) -> web.Response:
    service = request.app[CONNECTORS]
    service.manager.refresh()
    connector = service.manager.get(request.match_info["connector_id"])
    body = connector_body(request.app, connector, detail=True)
    body["tools"] = connector_tools(request.app, connector.id)
    return json_response(body)


async def trust_connector(request: web.Request) -> web.Response:
    service = request.app[CONNECTORS]
    connector = await service.trust(request.match_info["connector_id"])
    return json_response(service.public(connector, detail=True))


async def untrust_connector(request: web.Request) -> web.Response:
    service = request.app[CONNECTORS]
    connector = await service.untrust(request.match_info["connector_id"])
    return json_response(service.public(connector, detail=True))


async def install_connector(request: web.Request) -> web.Response:
    spec = await _parse(request, InstallRequest)
    connector = request.app[CONNECTORS].manager.install(Path(spec.path))
    return json_response(connector.public(detail=True), status=201)


def connector_body(app: web.Application, connector: Connector, *, detail: bool = False) -> dict[str, Any]:
    """A connector as the control API shows it, with its sign-in state (``auth``, ``auth_reason``) and
    whether its tools are being learned now (``learning_tools``: a probe runs just after trust)."""
    declared = connector.spec.launch.oauth is not None
    return {
        **app[CONNECTORS].public(connector, detail=detail),
        **app[OAUTH].public(connector.id, declared=declared),
        "learning_tools": app[CONNECTORS].tools.learning(connector.id),
    }


def connector_tools(app: web.Application, connector_id: str) -> list[dict[str, Any]]:
    """A connector's tools with their risks, whatever its source: as registered (trusted), else as its
    manifest declares them."""
    names = app[CONNECTORS].tools.registered(connector_id)
    registry = app[REGISTRY]
    if names:
        return [{"name": name, "risk": tool.risk.value} for name in names if (tool := registry.get(name)) is not None]
    declared = app[CONNECTORS].manager.get(connector_id).spec.tool_risks
    return [{"name": name, "risk": risk} for name, risk in sorted(declared.items())]


async def connect_connector(request: web.Request) -> web.Response:
    """Start (or join) a connector's OAuth sign-in: ``{"authorization_url", "flow", "auth"}``. A package
    with ``oauth-client.json`` may be given the user's own client (``ProviderSignIn``)."""
    given = await _parse(request, ProviderSignIn)
    flow = await start_sign_in(request.app, request.match_info["connector_id"], given=given)
    return json_response(flow, headers={"Cache-Control": "no-store"})


async def start_sign_in(
    app: web.Application, connector_id: str, *, given: ProviderSignIn | None = None
) -> dict[str, Any]:
    """Start (or join) the sign-in of a trusted remote connector or package (the CLI's ``connect``, the
    console's **Connect**): ``{"authorization_url", "flow", "auth", "auth_reason"}``."""
    given = given or ProviderSignIn()
    app[CONNECTORS].manager.refresh()  # the config as it is now on disk, not as the watcher last saw it
    connector = app[CONNECTORS].manager.get(connector_id)
    if connector.spec.launch.transport != "http" and connector.spec.oauth is None:
        raise RequestRejected(f"connector {connector_id} signs in to nothing (no remote server, no oauth-client.json)")
    if not app[TRUST].is_trusted(connector.key):
        raise RequestRejected(
            f"connector {connector_id} is not trusted as configured now: sidecar connectors trust {connector_id}"
        )
    if connector.spec.oauth is not None:
        return await sign_in_provider(
            app[OAUTH],
            connector_id,
            connector.spec.oauth,
            client_id=given.client_id,
            client_secret_file=given.client_secret_file,
        )
    if given.client_id is not None or given.client_secret_file is not None:
        raise RequestRejected(
            f'connector {connector_id} is a remote server: its client goes in its mcp.json entry\'s "oauth" block'
        )
    plan = launch_plan(connector.spec, LaunchContext(origin="", authorization="", envelope="", workspace=""))
    if plan.url is None:
        raise RequestRejected(f"connector {connector_id} has no URL")
    return await sign_in_remote(
        app[OAUTH], connector_id, url=plan.url, headers=plan.headers, client=connector.spec.launch.oauth
    )


class ProviderSignIn(_Body):
    """``connectors connect`` of a package with ``oauth-client.json``: the user's own client, if any."""

    client_id: str | None = Field(default=None, min_length=1, max_length=512)
    client_secret_file: str | None = Field(default=None, min_length=1, max_length=4096)
    """Absolute path of a file only the user can read; its secret is kept in the credential store."""


async def revoke_connector(request: web.Request) -> web.Response:
    """Delete a connector's grant now, abort its calls, revoke its tokens at the AS (RFC 7009)."""
    app, connector_id = request.app, request.match_info["connector_id"]
    app[CONNECTORS].manager.get(connector_id)  # 404 for an unknown id
    return json_response(await app[OAUTH].revoke(connector_id))


async def oauth_start(request: web.Request) -> web.Response:
    """A sign-in's start link (``browser_url``): binds the flow to this browser with a cookie, then sends
    it to the authorization server. The key is single use; a spent or unknown link changes nothing."""
    from sidecar.oauth.pages import PAGE_HEADERS, callback_page

    opened = request.app[OAUTH].open_in_browser(request.query.get("flow", ""), request.query.get("key", ""))
    if opened is None:
        request.app[REFUSALS].count("oauth_start", "unknown_link")
        message = "This sign-in link is not valid any more (used, expired or unknown). Run the sign-in again."
        return web.Response(
            text=callback_page(ok=False, message=message), content_type="text/html", status=400, headers=PAGE_HEADERS
        )
    url, cookie = opened
    response = web.Response(status=302, headers={**PAGE_HEADERS, "Location": url})
    response.set_cookie(
        cookie.name, cookie.value, path=CALLBACK_PATH, httponly=True, samesite="Lax", max_age=int(FLOW_TIMEOUT)
    )
    return response


async def oauth_callback(request: web.Request) -> web.Response:
    """The browser's way back from the authorization server: ``state`` names the flow, once, and only the
    browser that opened the flow's start link (its cookie) may finish it."""
    from sidecar.oauth.pages import PAGE_HEADERS, callback_page

    query = request.query
    answer = await request.app[OAUTH].complete(
        state=query.get("state"),
        code=query.get("code"),
        iss=query.get("iss"),
        error=query.get("error"),
        cookies=request.cookies,
    )
    if answer.refused is not None:
        request.app[REFUSALS].count("oauth_callback", answer.refused)  # one record a minute, never one per try
    return web.Response(
        text=callback_page(ok=answer.ok, message=answer.message),
        content_type="text/html",
        status=200 if answer.ok else 400,
        headers=PAGE_HEADERS,
    )


def add_control_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/control/status", status)
    r.add_post("/control/stop", stop)
    r.add_get("/control/sessions", list_sessions)
    r.add_post("/control/sessions", create_session)
    r.add_get("/control/sessions/{session_id}", get_session)
    r.add_patch("/control/sessions/{session_id}", change_session)
    r.add_delete("/control/sessions/{session_id}", end_session)
    r.add_get("/control/routes", list_routes)
    r.add_post("/control/routes/{name}/rotate", rotate_route)
    r.add_get("/control/connectors", list_connectors)
    r.add_post("/control/connectors/install", install_connector)
    r.add_get("/control/connectors/{connector_id}", show_connector)
    r.add_post("/control/connectors/{connector_id}/trust", trust_connector)
    r.add_post("/control/connectors/{connector_id}/untrust", untrust_connector)
    r.add_post("/control/connectors/{connector_id}/connect", connect_connector)
    r.add_post("/control/connectors/{connector_id}/revoke", revoke_connector)
    r.add_get(START_PATH, oauth_start)
    r.add_get(CALLBACK_PATH, oauth_callback)
    r.add_get("/control/approvals", list_approvals)
    r.add_get("/control/approvals/{approval_id}", get_approval)
    r.add_post("/control/approvals/{approval_id}/allow", allow_approval)
    r.add_post("/control/approvals/{approval_id}/deny", deny_approval)
