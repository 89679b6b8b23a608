"""The one HTML page the daemon serves: what ``/oauth/callback`` tells the person in the browser.

Every dynamic part is escaped; the page carries no token, code or state, loads nothing, and runs no
script (``Content-Security-Policy: default-src 'none'``), and the browser is asked to keep and refer
nothing (``Cache-Control: no-store``, ``Referrer-Policy: no-referrer``).
"""

from __future__ import annotations

import html
from typing import Final

__all__ = ["PAGE_HEADERS", "callback_page"]

PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


def callback_page(*, ok: bool, message: str) -> str:
    title = "Signed in" if ok else "Sign-in not completed"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>sidecar: {html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:4em auto;max-width:36em}</style></head>"
        f"<body><h1>{html.escape(title)}</h1><p>{html.escape(message)}</p></body></html>\n"
    )
