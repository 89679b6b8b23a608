"""``sidecar ui``: open the web console in the browser with a one-time sign-in link (issue 14 item 1).

The daemon mints the link (``POST /control/console/code`` with the control token, which never reaches
the browser); it works once, within 60 seconds, and the console drops it from the address bar. The link
is printed too, for a browser on a machine or in a profile ``webbrowser`` cannot open.
"""

from __future__ import annotations

import sys
import webbrowser
from typing import Any

from sidecar.paths import Paths

__all__ = ["add_ui_command", "cmd_ui"]


def add_ui_command(sub: Any) -> None:
    """Register ``sidecar ui`` on the top-level subparsers."""
    text = "open the web console (trust, approvals, sessions, audit) with a one-time sign-in link"
    parser = sub.add_parser("ui", help=text, description=text)
    parser.set_defaults(handler=cmd_ui)
    parser.add_argument("--no-browser", action="store_true", help="print the link only; open it yourself")


def cmd_ui(args: Any, paths: Paths) -> int:
    from sidecar.cli.client import ControlClient

    minted = ControlClient(paths).call("POST", "/control/console/code")
    url = str(minted["url"])
    print(f"sidecar console (this link works once, within {minted['expires_in']} s):\n\n  {url}\n", flush=True)
    if not args.no_browser and not webbrowser.open(url):
        print("(could not open a browser: open the link above yourself)", file=sys.stderr)
    return 0
