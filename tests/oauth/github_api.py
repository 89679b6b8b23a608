"""A stand-in for the part of GitHub's REST API the GitHub connector uses, behind the test AS.

Same token rule as ``upstream_api.Upstream`` (introspection at the AS); records each request (method,
path, query, JSON body) in ``upstream.seen``. Answers in GitHub's shapes, with a fixed repository
``octo/widgets`` holding issue 1 and pull request 2.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.oauth.upstream_api import Upstream

ISSUE: dict[str, Any] = {
    "number": 1,
    "title": "Flaky test in parser",
    "state": "open",
    "html_url": "https://github.com/octo/widgets/issues/1",
    "user": {"login": "alice"},
    "labels": [{"name": "bug"}],
    "body": "It fails one run in ten.",
    "comments": 0,
}
PULL: dict[str, Any] = {
    **ISSUE,
    "number": 2,
    "title": "Fix the parser",
    "head": {"ref": "fix-parser"},
    "base": {"ref": "main"},
    "merged": False,
    "mergeable": True,
    "draft": False,
    "pull_request": {},
}


def github_app(upstream: Upstream) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        body = await request.read()
        upstream.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "json": json.loads(body) if body else None,
                "api_version": request.headers.get("X-GitHub-Api-Version"),
            }
        )
        if not auth.startswith("Bearer ") or not await upstream._active(auth.removeprefix("Bearer ")):
            return web.json_response({"message": "Bad credentials"}, status=401)
        path, method = request.path, request.method
        if (method, path) == ("GET", "/search/issues"):
            return web.json_response({"total_count": 1, "items": [ISSUE]})
        if (method, path) == ("GET", "/search/code"):
            item = {"path": "src/parser.py", "repository": {"full_name": "octo/widgets"}, "html_url": "u"}
            return web.json_response({"total_count": 1, "items": [item]})
        if (method, path) == ("GET", "/repos/octo/widgets/issues"):
            return web.json_response([ISSUE, PULL])
        if (method, path) == ("GET", "/repos/octo/widgets/issues/1"):
            return web.json_response(ISSUE)
        if (method, path) == ("GET", "/repos/octo/widgets/pulls/2"):
            return web.json_response(PULL)
        if (method, path) == ("POST", "/repos/octo/widgets/issues"):
            return web.json_response({**ISSUE, "number": 3, **json.loads(body)}, status=201)
        return web.json_response({"message": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app
