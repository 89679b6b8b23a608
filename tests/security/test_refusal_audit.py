"""Requests refused before any credential is known write nothing per request (issue 21 item 4).

Anyone on loopback can send them at will: one audit record each would fill the disk and bury the real
records (37 MiB of junk in 5 s from one connection, before). They are counted per route and reason and
audited once per minute (or at stop), and an id taken from the URL is never written.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from sidecar.paths import Paths
from tests.conftest import running_daemon
from tests.helpers import HTTP_TIMEOUT

MARK = "zq7mark"


def _paths(tmp_path: Path) -> Paths:
    root = tmp_path / "home"
    return Paths(config=root / "config", state=root / "state", data=root / "data")


def _records(paths: Paths) -> list[dict[str, object]]:
    return [json.loads(line) for line in paths.audit_file.read_bytes().splitlines() if line.strip()]


async def test_a_thousand_unauthenticated_internal_api_requests_make_one_record(
    tmp_path: Path, workspace: Path
) -> None:
    paths = _paths(tmp_path)
    async with running_daemon(paths, workspace) as daemon:
        before = paths.audit_file.read_bytes()
        statuses = set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
            for n in range(1000):
                connector = f"{MARK}{n}" + "x" * 200
                headers = {"Authorization": "Bearer nothing"} if n % 2 else {}
                async with http.get(f"{daemon.url}/mcp/internal/{connector}/api/items", headers=headers) as answer:
                    statuses.add(answer.status)
                    await answer.read()
        assert statuses == {401}
        assert paths.audit_file.read_bytes() == before  # nothing written per request
    records = _records(paths)
    refused = [r for r in records if r["event"] == "request.refused"]
    assert [(r["route"], r["count"], r["reasons"]) for r in refused] == [("internal", 1000, {"unauthorized": 1000})]
    assert MARK not in paths.audit_file.read_text()  # the ids from the URL went nowhere
    assert not [r for r in records if r["event"] == "internal.request"]


async def test_failed_console_sign_ins_are_counted_not_recorded(tmp_path: Path, workspace: Path) -> None:
    paths = _paths(tmp_path)
    async with running_daemon(paths, workspace) as daemon:
        before = paths.audit_file.read_bytes()
        own = {"Origin": f"http://127.0.0.1:{daemon.port}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
            for _ in range(50):
                async with http.post(f"{daemon.url}/ui/api/session", json={"code": "A" * 43}, headers=own) as answer:
                    assert answer.status == 403
        assert paths.audit_file.read_bytes() == before
    refused = [r for r in _records(paths) if r["event"] == "request.refused"]
    assert [(r["route"], r["count"]) for r in refused] == [("console", 50)]


async def test_sign_in_links_that_lead_nowhere_are_counted_not_recorded(tmp_path: Path, workspace: Path) -> None:
    paths = _paths(tmp_path)
    async with running_daemon(paths, workspace) as daemon:
        before = paths.audit_file.read_bytes()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
            for n in range(100):
                query = {"state": f"{MARK}{n}", "code": "c"} if n % 2 else {"flow": f"{MARK}{n}", "key": "k"}
                path = "/oauth/callback" if n % 2 else "/oauth/start"
                async with http.get(f"{daemon.url}{path}", params=query, allow_redirects=False) as answer:
                    assert answer.status == 400 and "Set-Cookie" not in answer.headers
        assert paths.audit_file.read_bytes() == before
    refused = sorted((r["route"], r["count"], r["reasons"]) for r in _records(paths) if r["event"] == "request.refused")
    assert refused == [("oauth_callback", 50, {"unknown_state": 50}), ("oauth_start", 50, {"unknown_link": 50})]
    assert MARK not in paths.audit_file.read_text()


async def test_refusals_before_any_credential_are_counted_per_route_and_reason_not_recorded(
    tmp_path: Path, workspace: Path
) -> None:
    paths = _paths(tmp_path)
    async with running_daemon(paths, workspace) as daemon:
        session = await daemon.new_session()
        before = paths.audit_file.read_bytes()
        bad_envelope = {**session["headers"], "X-Sidecar-Context": "v1.x.y"}
        tries = [
            ("POST", "/mcp", {"Authorization": "Bearer wrong"}, 401),
            ("POST", "/mcp", bad_envelope, 403),
            ("GET", "/api/v1/mcp/tools", {}, 401),
            ("GET", "/control/status", {"Authorization": "Bearer wrong"}, 401),
            ("GET", "/control/status", {"Host": f"{MARK}.example"}, 403),
        ]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http:
            for _ in range(20):
                for method, path, headers, status in tries:
                    async with http.request(method, f"{daemon.url}{path}", headers=headers, json={}) as answer:
                        assert answer.status == status, (path, await answer.text())
        assert paths.audit_file.read_bytes() == before  # nothing written per request
    refused = {r["route"]: (r["count"], r["reasons"]) for r in _records(paths) if r["event"] == "request.refused"}
    assert refused == {
        "mcp": (40, {"unauthorized": 20, "invalid_session": 20}),
        "rest": (20, {"unauthorized": 20}),
        "control": (40, {"unauthorized": 20, "host_not_allowed": 20}),
    }
    assert MARK not in paths.audit_file.read_text()
