"""Open a secret URL in the browser without putting it on any command line.

``webbrowser`` starts the browser with the URL as an argument, and every process's arguments are
readable by every user of the machine (``/proc/<pid>/cmdline``): a one-time console code or an OAuth
``state`` there can be spent by someone else first. So the URL goes into a file only the user can read
(``<state>/open-<what>.html``, 0600, in the 0700 state directory), and the browser is given that file's
``file://`` path; the page sends it on at once (Jupyter answers the same problem the same way).

The file is rewritten by the next opening of the same kind and removed by ``forget`` once its URL is
spent or dead; what is in it is single-use and short-lived either way.
"""

from __future__ import annotations

import html
import json
import webbrowser
from pathlib import Path

from sidecar.paths import Paths
from sidecar.store.files import write_atomic

__all__ = ["forget", "open_privately", "redirect_file"]


def redirect_file(paths: Paths, what: str) -> Path:
    return paths.state / f"open-{what}.html"


def _page(url: str) -> bytes:
    shown = html.escape(url, quote=True)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="referrer" content="no-referrer">'
        f'<meta http-equiv="refresh" content="0;url={shown}"><title>sidecar</title></head>'
        f'<body><p>Opening <a href="{shown}">sidecar</a>…</p>'
        f"<script>location.replace({json.dumps(url)})</script></body></html>\n"
    ).encode()


def open_privately(paths: Paths, what: str, url: str) -> bool:
    """Open ``url`` through a private redirect file; False if no browser could be started."""
    path = redirect_file(paths, what)
    write_atomic(path, _page(url))
    return webbrowser.open(path.as_uri())


def forget(paths: Paths, what: str) -> None:
    redirect_file(paths, what).unlink(missing_ok=True)
