"""The GitHub connector: issues, pull requests and code search over GitHub's REST API, through sidecar.

An MCP server over stdio, started by sidecar per session. It never holds the user's GitHub token: every
request goes to sidecar's internal API (``GITHUB_API``, i.e. ``<daemon>/mcp/internal/github/api``) with
this process's own credential (``SIDECAR_API_AUTHORIZATION``) and the session's envelope
(``SIDECAR_API_CONTEXT``); sidecar checks the path against ``oauth-client.json``'s upstream, attaches the
real token and forwards the request to ``https://api.github.com``.

Tools: LOW reads (``search_issues``, ``list_issues``, ``get_issue``, ``list_pull_requests``,
``get_pull_request``, ``search_code``) and MEDIUM writes (``create_issue``, ``comment_on_issue``).
A 401 from sidecar means there is no usable sign-in: the tool says so in plain words.
"""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Any, Final

import httpx2
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

TIMEOUT: Final = 60.0
MAX_TEXT: Final = 60_000
"""Characters of an answer handed back to the agent; longer answers are cut with a note."""
_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,99})")
_READ: Final = ToolAnnotations(read_only_hint=True, open_world_hint=True)
_WRITE: Final = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)

Owner = Annotated[str, Field(description="Repository owner (user or organisation), e.g. octo")]
Repo = Annotated[str, Field(description="Repository name, e.g. widgets")]
Number = Annotated[int, Field(ge=1, description="Issue or pull request number")]
State = Annotated[str, Field(pattern="^(open|closed|all)$", description="open, closed or all")]
PerPage = Annotated[int, Field(ge=1, le=100, description="How many results (at most 100)")]


class GitHub:
    """GitHub's REST API as seen through sidecar's internal API."""

    def __init__(self, base: str, authorization: str, context: str) -> None:
        self._base = base.rstrip("/")
        self._headers = {
            "Authorization": authorization,
            "X-Sidecar-Context": context,
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }

    async def call(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
            answer = await http.request(method, self._base + path, params=params, json=body, headers=self._headers)
        if answer.status_code == 401:
            raise ToolError(
                "unauthorized: sidecar has no usable GitHub sign-in for this connector (never signed in, "
                "revoked, or expired). Ask the user to run: sidecar connectors connect github"
            )
        if answer.status_code == 403 and answer.headers.get("content-type", "").startswith("application/json"):
            detail = _message(answer)
            raise ToolError(f"refused (403): {detail}")
        if answer.status_code >= 400:
            raise ToolError(f"GitHub answered {answer.status_code}: {_message(answer)}")
        return answer.json() if answer.content else None


def _message(answer: httpx2.Response) -> str:
    try:
        data = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("error") or data)[:200]
    return str(data)[:200]


def _repo(owner: str, repo: str) -> str:
    for value, what in ((owner, "owner"), (repo, "repo")):
        if not _NAME.fullmatch(value) or value in (".", ".."):
            raise ToolError(f"{what} must be a GitHub name (letters, digits, '.', '-', '_')")
    return f"/repos/{owner}/{repo}"


def _text(data: Any) -> str:
    text = json.dumps(data, indent=1, ensure_ascii=False)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n[cut: narrow the query for the rest]"


def _issue(item: dict[str, Any]) -> dict[str, Any]:
    keys = ("number", "title", "state", "html_url", "created_at", "updated_at", "comments", "body")
    summary = {key: item.get(key) for key in keys}
    summary["user"] = (item.get("user") or {}).get("login")
    summary["labels"] = [label.get("name") for label in item.get("labels") or [] if isinstance(label, dict)]
    if "pull_request" in item:
        summary["is_pull_request"] = True
    return summary


def build_server(github: GitHub) -> MCPServer:
    server: MCPServer = MCPServer(
        name="github",
        version="0.1.0",
        instructions="GitHub issues, pull requests and code search, as the user who signed in to sidecar.",
        log_level="WARNING",
    )

    @server.tool(annotations=_READ, structured_output=False)
    async def search_issues(
        query: Annotated[str, Field(min_length=1, max_length=256, description="GitHub search syntax")],
        per_page: PerPage = 20,
    ) -> str:
        """Search issues and pull requests (GitHub search syntax, e.g. 'repo:octo/widgets is:open flaky')."""
        found = await github.call("GET", "/search/issues", params={"q": query, "per_page": per_page})
        return _text({"total": found.get("total_count"), "items": [_issue(i) for i in found.get("items", [])]})

    @server.tool(annotations=_READ, structured_output=False)
    async def list_issues(owner: Owner, repo: Repo, state: State = "open", per_page: PerPage = 30) -> str:
        """List a repository's issues (pull requests are marked as such)."""
        found = await github.call("GET", f"{_repo(owner, repo)}/issues", params={"state": state, "per_page": per_page})
        return _text([_issue(i) for i in found])

    @server.tool(annotations=_READ, structured_output=False)
    async def get_issue(owner: Owner, repo: Repo, number: Number) -> str:
        """One issue with its body."""
        return _text(_issue(await github.call("GET", f"{_repo(owner, repo)}/issues/{number}")))

    @server.tool(annotations=_READ, structured_output=False)
    async def list_pull_requests(owner: Owner, repo: Repo, state: State = "open", per_page: PerPage = 30) -> str:
        """List a repository's pull requests."""
        found = await github.call("GET", f"{_repo(owner, repo)}/pulls", params={"state": state, "per_page": per_page})
        return _text([_issue(p) | {"head": (p.get("head") or {}).get("ref")} for p in found])

    @server.tool(annotations=_READ, structured_output=False)
    async def get_pull_request(owner: Owner, repo: Repo, number: Number) -> str:
        """One pull request: title, body, state, branches, and whether it can be merged."""
        pull = await github.call("GET", f"{_repo(owner, repo)}/pulls/{number}")
        extra = {key: pull.get(key) for key in ("merged", "mergeable", "draft", "additions", "deletions")}
        refs = {"head": (pull.get("head") or {}).get("ref"), "base": (pull.get("base") or {}).get("ref")}
        return _text(_issue(pull) | extra | refs)

    @server.tool(annotations=_READ, structured_output=False)
    async def search_code(
        query: Annotated[str, Field(min_length=1, max_length=256, description="e.g. 'parse_config repo:octo/widgets'")],
        per_page: PerPage = 20,
    ) -> str:
        """Search code (GitHub code search syntax); paths and repositories of the matches."""
        found = await github.call("GET", "/search/code", params={"q": query, "per_page": per_page})
        items = [
            {
                "path": i.get("path"),
                "repository": (i.get("repository") or {}).get("full_name"),
                "url": i.get("html_url"),
            }
            for i in found.get("items", [])
        ]
        return _text({"total": found.get("total_count"), "items": items})

    @server.tool(annotations=_WRITE, structured_output=False)
    async def create_issue(
        owner: Owner,
        repo: Repo,
        title: Annotated[str, Field(min_length=1, max_length=256)],
        body: Annotated[str, Field(max_length=65536)] = "",
    ) -> str:
        """Open a new issue in a repository."""
        created = await github.call("POST", f"{_repo(owner, repo)}/issues", body={"title": title, "body": body})
        return _text(_issue(created))

    @server.tool(annotations=_WRITE, structured_output=False)
    async def comment_on_issue(
        owner: Owner, repo: Repo, number: Number, body: Annotated[str, Field(min_length=1, max_length=65536)]
    ) -> str:
        """Add a comment to an issue or pull request."""
        comment = await github.call("POST", f"{_repo(owner, repo)}/issues/{number}/comments", body={"body": body})
        return _text({"id": comment.get("id"), "html_url": comment.get("html_url")})

    return server


def main() -> None:
    github = GitHub(
        os.environ.get("GITHUB_API", ""),
        os.environ.get("SIDECAR_API_AUTHORIZATION", ""),
        os.environ.get("SIDECAR_API_CONTEXT", ""),
    )
    build_server(github).run()


if __name__ == "__main__":
    main()
