"""A browser for ``$BROWSER``: ``python -m tests.oauth.browser URL`` follows the authorization URL.

Given a ``file://`` URL (how sidecar hands a secret URL to a browser), it reads that page and follows
its refresh, as a browser would; it refuses a secret on its own command line (a ``state`` in the URL
it was started with), since every user of the machine can read that.

It keeps cookies and follows redirects through the authorization server's (auto-approving)
interactions to the daemon's ``/oauth/callback``, then prints the final URL's path and the page's
status, and exits 0 when the page says the sign-in worked.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx2


def main() -> int:
    url = sys.argv[1]
    if "state=" in url or "code=" in url:
        print(f"browser: a secret on the command line: {url}", flush=True)
        return 2
    if url.startswith("file://"):
        redirect = Path(urlsplit(url).path).read_text()
        found = re.search(r'http-equiv="refresh" content="0;url=([^"]+)"', redirect)
        if found is None:
            print("browser: the file leads nowhere", flush=True)
            return 2
        url = html.unescape(found.group(1))
    with httpx2.Client(follow_redirects=True, timeout=30) as http:
        answer = http.get(url)
    print(f"browser: {answer.status_code} {answer.url.path}", flush=True)
    return 0 if "You can close this tab" in answer.text else 1


if __name__ == "__main__":
    sys.exit(main())
