"""``sidecar session``: create, list, change and end the sessions agents connect with.

``session new`` prints a client configuration for a host (``--format``); ``list`` shows each session with
what a person knows it by: its label, the client that last initialized on it, when it was made and
last used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sidecar.cli.common import ago, command, control_client, group, show
from sidecar.cli.options import add_session_options, session_body
from sidecar.paths import Paths

__all__ = ["add_session_commands"]


def cmd_session_new(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar.cli.formats import render, render_env_refs

    if args.env_refs:
        try:
            print(json.dumps(render_env_refs(args.format, connector=args.connector), indent=2))
        except ValueError as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return 2
        return 0

    workspace = str(Path(args.workspace or os.getcwd()).absolute())
    body = session_body(args, workspace=workspace, project=args.project)
    if args.format != "raw":
        body.setdefault("label", args.format)
    created = control_client(paths).call("POST", "/control/sessions", body)
    print(json.dumps(render(args.format, created), indent=2))
    return 0


def cmd_session_list(args: argparse.Namespace, paths: Paths) -> int:
    sessions = control_client(paths).call("GET", "/control/sessions")["sessions"]
    now = time.time()
    lines = [
        f"{s['session_id']}  {s['label'] or '-':<16.16}  {s['client'] or '-':<20.20}  {s['mode']:<9}  "
        f"{ago(s['created_at'], now):<9}  {ago(s['last_used_at'], now):<9}  {s['project_id']:<16}  "
        f"{s['workspace']}"
        for s in sessions
    ]
    if lines:
        header = f"{'ID':<24}  {'LABEL':<16}  {'CLIENT':<20}  {'MODE':<9}  {'CREATED':<9}  {'LAST USED':<9}  "
        lines.insert(0, header + f"{'PROJECT':<16}  WORKSPACE")
    show(args, sessions, "\n".join(lines) or "no sessions")
    return 0


def cmd_session_end(args: argparse.Namespace, paths: Paths) -> int:
    result = control_client(paths).call("DELETE", f"/control/sessions/{args.session_id}")
    show(args, result, f"ended {args.session_id} ({result['aborted']} in-flight requests aborted)")
    return 0


def cmd_session_update(args: argparse.Namespace, paths: Paths) -> int:
    body: dict[str, Any] = {}
    if args.mode is not None:
        body["mode"] = args.mode
    if args.allow is not None:
        body["allow"] = args.allow
    if args.network is not None:
        body["network"] = args.network
    result = control_client(paths).call("PATCH", f"/control/sessions/{args.session_id}", body)
    show(args, result, f"updated {args.session_id}: mode {result['mode']}, allow {' '.join(result['allow'])}")
    return 0


def add_session_commands(sub: Any) -> None:
    """Register ``sidecar session new|list|end|update`` on the top-level subparsers."""
    actions = group(sub, "session", "create, list, change and end agent sessions")
    new = command(actions, "new", cmd_session_new, "create a session and print a client configuration", json=True)
    new.add_argument("--project", default="default")
    new.add_argument("--workspace", help="the session's workspace directory (default: current directory)")
    add_session_options(new, label_default="the --format, when it names a host")
    new.add_argument("--format", choices=["raw", "claude-code", "cursor", "vscode", "claude-desktop"], default="raw")
    new.add_argument(
        "--env-refs",
        action="store_true",
        help="print a config that names sidecar exec's environment variables instead of holding secrets (it can "
        "be committed; run the agent with sidecar exec). No session is created. claude-code only",
    )
    command(actions, "list", cmd_session_list, "list live sessions", json=True)
    end = command(actions, "end", cmd_session_end, "end a session and abort its in-flight calls", json=True)
    end.add_argument("session_id")
    update = command(actions, "update", cmd_session_update, "change a session's mode or grant", json=True)
    update.add_argument("session_id")
    update.add_argument("--mode", choices=["default", "read-only", "bypass"])
    update.add_argument("--allow", action="append", metavar="PATTERN")
    update.add_argument("--network", action=argparse.BooleanOptionalAction, default=None)
