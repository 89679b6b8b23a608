"""The web console (issue 14): a page the daemon serves at ``/ui`` for the decisions a person makes.

Trusting and untrusting connectors (with exactly what will run), granting or denying pending approvals,
ending sessions, reading the audit log. ``routes`` holds the sign-in and the small JSON API the page
calls; ``views`` builds what it shows from the same objects and functions as the control API; the page
itself (``static/``: HTML, CSS and a little JavaScript, no build step, nothing fetched from elsewhere)
ships in the package.
"""

from sidecar.console.routes import SIGNIN_PATH, add_console_routes, console_url, is_console_path

__all__ = ["SIGNIN_PATH", "add_console_routes", "console_url", "is_console_path"]
