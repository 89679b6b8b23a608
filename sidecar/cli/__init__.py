"""The ``sidecar`` command line. Each command is a function returning an exit code.

Exit codes: 0 ok, 1 the operation failed (the message says why), 2 bad usage (argparse).
Everything that talks to a running daemon goes through the control API (``cli/client.py``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar import __version__
from sidecar.cli.common import ago, command, control_client, group, sandbox_text, show
from sidecar.cli.exec import add_exec_command
from sidecar.cli.sessions import add_session_commands
from sidecar.cli.ui import add_ui_command
from sidecar.errors import SidecarError
from sidecar.paths import Paths

__all__ = ["main"]


def cmd_serve(args: argparse.Namespace, paths: Paths) -> int:
    import asyncio

    from sidecar import tuning

    tuning.skip_uvicorn()  # before the daemon imports the SDK
    from sidecar.config import check_bind_host, load_settings
    from sidecar.daemon import serve

    check_bind_host(args.host)
    settings = load_settings(paths.settings_file, overrides={"port": args.port})
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(serve(settings, paths, dedicated=True))


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    status = control_client(paths).call("GET", "/control/status")
    connectors = ", ".join(f"{c['id']} ({_state(c)}{_sign_in(c)})" for c in status["connectors"]) or "-"
    text = (
        f"sidecar {status['version']} running (pid {status['pid']})\n"
        f"  url:        {status['url']}\n"
        f"  uptime:     {status['uptime_seconds']:.0f}s\n"
        f"  sessions:   {status['sessions']}{_recent(status.get('recent_sessions') or [])}\n"
        f"  routes:     {', '.join(status['routes']) or '-'}\n"
        f"  connectors: {connectors}\n"
        f"  storage:    {status['storage']['credentials']}"
        + (" (INSECURE)" if status["storage"]["insecure"] else "")
        + f"\n  approvals:  {status['pending_approvals']} pending"
        + f"\n  peers:      {_peer_check(status['peer_check'])}"
        + f"\n  sandbox:    {_sandbox(status['sandbox'])}"
        + "".join(f"\n  BILLING MANIFEST PROBLEM (billable checks ask): {p}" for p in status["billing_problems"])
        + (
            f"\n  TRUST STORE REFUSED (last good trust kept; nothing written): {p}"
            if (p := status.get("trust_store_problem"))
            else ""
        )
    )
    show(args, status, text)
    return 0


def _recent(sessions: list[dict[str, Any]]) -> str:
    """The sessions used last, by label and client: `` (last used: claude-code, Claude Code 2.1, 5m ago; …)``."""
    now = time.time()
    named = [
        ", ".join(filter(None, (s["label"] or s["session_id"], s["client"], ago(s["last_used_at"], now))))
        for s in sessions
        if s["last_used_at"] is not None
    ]
    return f" (last used: {'; '.join(named)})" if named else ""


def _peer_check(check: dict[str, Any]) -> str:
    """The front door in one line: whether other accounts are kept out, and what was refused."""
    refused = f"{check['refused']} connections refused"
    if check["refused"]:
        reasons = check["refused_by_reason"].items()
        refused += " (" + ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in reasons) + ")"
    if check["accept_pauses"]:
        refused += f"; accepting paused {check['accept_pauses']} times (out of file descriptors)"
    if check["checked"]:
        return f"other OS accounts refused at accept; {refused}"
    return f"NOT CHECKED ({check['reason']}): any local account may connect; {refused}"


def _sandbox(support: dict[str, Any]) -> str:
    """Whether connectors run sandboxed here (with what), or why not."""
    if support["available"]:
        return f"connectors run sandboxed ({support['reason']})"
    return f"NONE: {support['reason']}"


def cmd_stop(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar.system import pid_alive

    client = control_client(paths)
    pid = client.runtime["pid"]
    client.call("POST", "/control/stop")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        # The process itself, not runtime.json: the daemon removes that file before its last cleanup.
        if not pid_alive(pid):
            print(f"stopped sidecar (pid {pid})")
            return 0
        time.sleep(0.05)
    print(f"sidecar (pid {pid}) did not stop within {args.timeout:g}s", file=sys.stderr)
    return 1


def cmd_routes_list(args: argparse.Namespace, paths: Paths) -> int:
    routes = control_client(paths).call("GET", "/control/routes")["routes"]
    show(args, routes, "\n".join(f"{r['name']:<24} {r['path']}" for r in routes) or "no routes")
    return 0


def cmd_routes_rotate(args: argparse.Namespace, paths: Paths) -> int:
    control_client(paths).call("POST", f"/control/routes/{args.name}/rotate")
    print(f"rotated the token of {args.name}; its in-flight requests were aborted. Issue new sessions.")
    return 0


def _sign_in(connector: dict[str, Any]) -> str:
    auth = connector.get("auth", "none")
    return "" if auth == "none" else f", sign-in {auth}"


def _state(connector: dict[str, Any]) -> str:
    """A connector's state, and how many sessions have it connected (its processes are per session)."""
    sessions = connector.get("connected_sessions", 0)
    if connector["state"] == "trusted" and sessions:
        return f"trusted, connected in {sessions} session{'s' if sessions != 1 else ''}"
    return str(connector["state"])


def cmd_connectors_list(args: argparse.Namespace, paths: Paths) -> int:
    found = control_client(paths).call("GET", "/control/connectors")
    lines = [
        f"{c['id']:<24} {c['state']:<13} {c.get('connected_sessions', 0):>8} {c['kind']:<8} {c['transport']:<9} "
        f"{c.get('auth', 'none')}"
        for c in found["connectors"]
    ]
    if lines:
        lines.insert(0, f"{'ID':<24} {'STATE':<13} {'SESSIONS':>8} {'KIND':<8} {'TRANSPORT':<9} SIGN-IN")
    lines += [f"problem: {p}" for p in found["problems"]]
    show(args, found, "\n".join(lines) or "no connectors configured")
    return 0


def cmd_connectors_show(args: argparse.Namespace, paths: Paths) -> int:
    c = control_client(paths).call("GET", f"/control/connectors/{args.connector_id}")
    apart = (
        "last_failure",
        "billable",
        "tools",
        "learning_tools",
        "tool_risks",
        "granted_scopes",
        "granted_beyond_asked",
        "sandbox",
    )
    shown = {k: v for k, v in c.items() if k not in apart}
    lines = [f"{k:<12} {v}" for k, v in shown.items() if v not in (None, [], {})]
    if "granted_scopes" in c:
        lines.append(f"scopes       granted: {' '.join(c['granted_scopes']) or '(none named)'}")
        if c.get("granted_beyond_asked"):
            wider = " ".join(c["granted_beyond_asked"])
            lines.append(f"  more than the sign-in asked for: {wider} (the grant is kept; revoke to end it)")
    if c.get("sandbox"):
        lines.append(f"sandbox      {sandbox_text(c['sandbox'])}")
    tools = c.get("tools") or []
    if c.get("learning_tools"):
        lines.append("tools        learning them now (it was just trusted): show it again in a moment")
    elif tools:
        lines.append("tools        (risk, name)")
        lines += [f"  {t['risk']:<6} {t['name']}" for t in tools]
    else:
        lines.append("tools        " + ("none" if c.get("state") == "trusted" else "learned when it is trusted"))
    billable = c.get("billable") or {}
    if billable:
        lines.append("billable     every call asks, in every mode:")
        lines += [f"  {name} ({t['approvalKind']}, group {t['group']})" for name, t in billable.items()]
    elif not c.get("billing_problem"):
        lines.append("billable     none")
    failure = c.get("last_failure")
    if failure:
        # The daemon has escaped and bounded the connector's stderr lines (connectors/failures.py).
        lines.append(f"last failure {failure['at']}, session {failure['session_id']}: {failure['reason']}")
        lines += [f"  | {line}" for line in failure["stderr"]] or ["  (it wrote nothing to stderr)"]
    show(args, c, "\n".join(lines))
    return 0


def cmd_connectors_trust(args: argparse.Namespace, paths: Paths) -> int:
    c = control_client(paths).call("POST", f"/control/connectors/{args.connector_id}/trust")
    show(args, c, f"trusted {c['id']} as it is now ({c['trust_key']}); any edit to it needs trust again")
    return 0


def cmd_connectors_untrust(args: argparse.Namespace, paths: Paths) -> int:
    c = control_client(paths).call("POST", f"/control/connectors/{args.connector_id}/untrust")
    show(args, c, f"untrusted {c['id']}")
    return 0


def cmd_connectors_connect(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar.cli.signin import connect

    client: dict[str, str] = {"client_id": args.client_id} if args.client_id else {}
    if args.client_secret_file:
        client["client_secret_file"] = str(Path(args.client_secret_file).absolute())
    return connect(
        control_client(paths),
        paths,
        args.connector_id,
        browser=not args.no_browser,
        timeout=args.timeout,
        client_info=client or None,
    )


def cmd_connectors_revoke(args: argparse.Namespace, paths: Paths) -> int:
    r = control_client(paths).call("POST", f"/control/connectors/{args.connector_id}/revoke")
    show(args, r, f"revoked {r['revoked']}: local credentials deleted ({r['deleted']}); remotely: {r['remote']}")
    return 0


def cmd_connectors_install(args: argparse.Namespace, paths: Paths) -> int:
    c = control_client(paths).call("POST", "/control/connectors/install", {"path": str(Path(args.path).absolute())})
    show(args, c, f"installed {c['id']} from {args.path}; review it, then: sidecar connectors trust {c['id']}")
    return 0


def cmd_approvals_list(args: argparse.Namespace, paths: Paths) -> int:
    query = "?all=1" if args.all else ""
    approvals = control_client(paths).call("GET", f"/control/approvals{query}")["approvals"]
    lines = []
    for a in approvals:
        lines.append(
            f"{a['approval_id']}  {a['state']:<8}  {a['kind']:<10}  {a['tool']:<32}  session {a['session_id']}"
            + (f"  group {a['group']}" if a["group"] else "")
        )
        lines.extend(_argument_lines(a))
    show(args, approvals, "\n".join(lines) or "no pending approvals")
    return 0


def cmd_approvals_show(args: argparse.Namespace, paths: Paths) -> int:
    a = control_client(paths).call("GET", f"/control/approvals/{args.approval_id}")
    head = [f"{key:<10} {a[key]}" for key in ("approval_id", "state", "kind", "tool", "session_id", "group") if a[key]]
    show(args, a, "\n".join([*head, "arguments:", *_argument_lines(a)]))
    return 0


def _argument_lines(approval: dict[str, Any]) -> list[str]:
    """One line per top-level argument, short values first, each bounded on its own with what is left."""
    lines = []
    for argument in approval["arguments"]:
        more = argument["more"]
        rest = f"  … {more} more characters: sidecar approvals show {approval['approval_id']}" if more else ""
        lines.append(f"    {argument['name']}: {argument['value']}{rest}")
    return lines


def cmd_approvals_allow(args: argparse.Namespace, paths: Paths) -> int:
    body = {"remember": args.remember} if args.remember else {}
    approval = control_client(paths).call("POST", f"/control/approvals/{args.approval_id}/allow", body)
    how = f" (remembered for the session: {approval['group']})" if args.remember else " (once)"
    show(args, approval, f"allowed {approval['tool']}{how}; the agent can retry the call now")
    return 0


def cmd_approvals_deny(args: argparse.Namespace, paths: Paths) -> int:
    approval = control_client(paths).call("POST", f"/control/approvals/{args.approval_id}/deny")
    show(args, approval, f"denied {approval['tool']}")
    return 0


def cmd_audit(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar.store.auditverify import verify

    if args.verify:
        report = verify(paths.audit_file)
        data = {"ok": report.ok, "records": report.records, "problems": report.problems}
        text = (
            f"audit log ok: {report.records} records, chain intact"
            if report.ok
            else (f"audit log TAMPERED ({report.records} records):\n  " + "\n  ".join(report.problems))
        )
        show(args, data, text)
        return 0 if report.ok else 1
    from sidecar.cli.auditlog import human_line, tail

    return tail(
        paths.audit_file, follow=args.follow, render=(lambda line: line.rstrip("\n")) if args.json else human_line
    )


def cmd_service(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar import service

    result = service.install() if args.action == "install" else service.uninstall()
    done = f"wrote {result.path}" if args.action == "install" else f"removed {result.path}"
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.manager_failed:
        # The file alone does nothing: say so, and what to do, instead of "installed".
        print(
            f"{done}, but the service manager did not take it (above): run those commands yourself once it is "
            "available (a session without a user manager, such as a container or an SSH login without "
            "lingering, has none: `loginctl enable-linger` gives one)",
            file=sys.stderr,
        )
        return 1
    print(f"{done}; the service is {'installed and started' if args.action == 'install' else 'stopped and removed'}")
    return 0


def _daemon_commands(sub: Any) -> None:
    serve = command(sub, "serve", cmd_serve, "run the daemon in the foreground")
    serve.add_argument("--port", type=int, default=None, help="TCP port (0 = any free port)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (only 127.0.0.1 is accepted)")
    serve.add_argument("-v", "--verbose", action="store_true")
    command(sub, "status", cmd_status, "show the running daemon", json=True)
    stop = command(sub, "stop", cmd_stop, "stop the running daemon")
    stop.add_argument("--timeout", type=float, default=15.0)
    svc = command(sub, "service", cmd_service, "install or remove the background service (systemd/launchd)")
    svc.add_argument("action", choices=["install", "uninstall"])


def _connector_commands(sub: Any) -> None:
    actions = group(sub, "connectors", "list, inspect, trust, untrust and install connectors (MCP servers)")
    command(actions, "list", cmd_connectors_list, "every connector and its state", json=True)
    for name, handler, help_text in (
        ("show", cmd_connectors_show, "one connector in detail (launch config, trust key, tool risks, last failure)"),
        ("trust", cmd_connectors_trust, "trust a connector as it is configured now"),
        ("untrust", cmd_connectors_untrust, "withdraw trust: its processes stop and its tools leave every session"),
    ):
        command(actions, name, handler, help_text, json=True).add_argument("connector_id")
    connect = command(
        actions,
        "connect",
        cmd_connectors_connect,
        "sign in to a remote connector or a package's provider (OAuth, in a browser)",
    )
    connect.add_argument("connector_id")
    connect.add_argument("--no-browser", action="store_true", help="print the URL only; open it yourself")
    connect.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the sign-in")
    connect.add_argument("--client-id", help="a package's OAuth client: the id you registered with the provider")
    connect.add_argument(
        "--client-secret-file", help="a file only you can read holding that client's secret (kept encrypted)"
    )
    revoke = command(actions, "revoke", cmd_connectors_revoke, "delete and revoke a connector's sign-in", json=True)
    revoke.add_argument("connector_id")
    install = command(actions, "install", cmd_connectors_install, "validate and install a connector package", json=True)
    install.add_argument("path")


def _access_commands(sub: Any) -> None:
    routes = group(sub, "routes", "list routes, rotate a route's token")
    command(routes, "list", cmd_routes_list, "list mounted routes", json=True)
    rotate = command(routes, "rotate", cmd_routes_rotate, "re-mint a route's token (aborts its in-flight requests)")
    rotate.add_argument("name")

    approvals = group(sub, "approvals", "list, allow or deny tool calls waiting for approval")
    pending = command(approvals, "list", cmd_approvals_list, "pending approvals", json=True)
    pending.add_argument("--all", action="store_true", help="also show used, denied and expired ones")
    allow = command(approvals, "allow", cmd_approvals_allow, "allow a pending call (once)", json=True)
    allow.add_argument("approval_id")
    allow.add_argument("--remember", choices=["session"], help="allow its group for the rest of the session")
    show = command(approvals, "show", cmd_approvals_show, "one approval with every argument in full", json=True)
    show.add_argument("approval_id")
    deny = command(approvals, "deny", cmd_approvals_deny, "deny a pending call", json=True)
    deny.add_argument("approval_id")

    audit = command(
        sub,
        "audit",
        cmd_audit,
        "print the audit log (one line per record; --json: as written), follow it, or verify its chain",
        json=True,
    )
    audit.add_argument("--follow", action="store_true")
    audit.add_argument("--verify", action="store_true")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sidecar", description="One safe local MCP endpoint for every agent.")
    parser.add_argument("--version", action="version", version=f"sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _daemon_commands(sub)
    add_session_commands(sub)
    _connector_commands(sub)
    _access_commands(sub)
    add_exec_command(sub)
    add_ui_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths = Paths.resolve()
    try:
        code: int = args.handler(args, paths)
        return code
    except SidecarError as err:
        print(f"sidecar: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
