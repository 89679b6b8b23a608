"""``sidecar ui``: open the web console in the browser with a one-time sign-in link (issue 14 item 1).

The daemon mints the link (``POST /control/console/code`` with the control token, which never reaches
the browser); it works once, within 60 seconds, and the console drops it from the address bar. The
browser is given a private file that leads to it, never the link itself (``cli.browser``: a command
line is readable by every user). ``--no-browser`` prints the link instead, for a browser on a machine
or in a profile this cannot open.
"""

from __future__ import annotations

import sys
from typing import Any

from sidecar.cli.browser import open_privately, redirect_file
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
    url, lifetime = str(minted["url"]), minted["expires_in"]
    if args.no_browser:
        print(
            f"sidecar console (this link works once, within {lifetime} s; it is a secret: whoever opens it "
            f"first is signed in):\n\n  {url}\n",
            flush=True,
        )
        return 0
    if not open_privately(paths, "console", url):
        print("could not open a browser: run sidecar ui --no-browser and open the link yourself", file=sys.stderr)
        return 1
    print(f"opening the sidecar console in your browser (through {redirect_file(paths, 'console')})")
    return 0
