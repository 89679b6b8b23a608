"""``sidecar connectors connect ID``: start a sign-in in the daemon, open the browser, wait for the outcome.

The daemon runs the flow and receives the browser's answer on its own ``/oauth/callback``; this side
opens the flow's start link (``browser_url``: a daemon page that binds the flow to that browser, then
sends it to the authorization server) through a private file, never on a command line (``cli.browser``;
the browser is ``webbrowser``'s, which honours ``$BROWSER``), or prints it with ``--no-browser``, and
polls the connector's sign-in state (bounded) until it is ``ready`` or ``error``.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

from sidecar.cli.browser import forget, open_privately
from sidecar.oauth.flow import check_authorization_url
from sidecar.paths import Paths

__all__ = ["connect"]

POLL_INTERVAL: Final = 0.5


def connect(
    client: Any,
    paths: Paths,
    connector_id: str,
    *,
    browser: bool,
    timeout: float,
    client_info: dict[str, str] | None = None,
) -> int:
    """``client_info``: a package's OAuth client the user registered (``client_id``, ``client_secret_file``)."""
    started = client.call("POST", f"/control/connectors/{connector_id}/connect", client_info)
    if started.get("authorization_url") is None:
        print(f"{connector_id}: no sign-in needed (sign-in state: {started.get('auth')})")
        return 0
    check_authorization_url(started["authorization_url"])  # SECURITY: only https (or loopback http) is opened
    url = started["browser_url"]  # the daemon's start link, which leads there
    what = f"signin-{connector_id}"
    try:
        if not browser:
            print(f"Sign in to {connector_id}: open this URL yourself (it is a secret until used):\n\n  {url}\n")
        elif open_privately(paths, what, url):
            print(f"Sign in to {connector_id} in your browser (opened for you)", flush=True)
        else:
            print("could not open a browser: run again with --no-browser and open the URL yourself", file=sys.stderr)
            return 1
        sys.stdout.flush()
        return _wait(client, connector_id, timeout)
    finally:
        forget(paths, what)


def _wait(client: Any, connector_id: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = client.call("GET", f"/control/connectors/{connector_id}")
        if found.get("auth") == "ready":
            print(f"signed in to {connector_id}")
            return 0
        if found.get("auth") == "error":
            print(f"sign-in to {connector_id} failed: {found.get('auth_reason')}", file=sys.stderr)
            return 1
        time.sleep(POLL_INTERVAL)
    print(f"sign-in to {connector_id} did not finish within {timeout:g}s", file=sys.stderr)
    return 1
