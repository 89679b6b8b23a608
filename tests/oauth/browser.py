"""A browser for ``$BROWSER``: ``python -m tests.oauth.browser URL`` follows the authorization URL.

It keeps cookies and follows redirects through the authorization server's (auto-approving)
interactions to the daemon's ``/oauth/callback``, then prints the final URL's path and the page's
status, and exits 0 when the page says the sign-in worked.
"""

from __future__ import annotations

import sys

import httpx2


def main() -> int:
    with httpx2.Client(follow_redirects=True, timeout=30) as http:
        page = http.get(sys.argv[1])
    print(f"browser: {page.status_code} {page.url.path}", flush=True)
    return 0 if "You can close this tab" in page.text else 1


if __name__ == "__main__":
    sys.exit(main())
