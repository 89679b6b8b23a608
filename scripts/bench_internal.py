"""Benchmark: the internal API hop — an upstream call through ``/mcp/internal/<id>/api`` against a direct call.

One run, two paths to the same upstream (a small aiohttp stand-in in this process that accepts one bearer
token and answers a 60-byte JSON document), both measured from a connector-like subprocess with the same
client code (``httpx2.AsyncClient``, keep-alive, sequential GETs, after a warm-up):

* **direct**: the subprocess calls the upstream itself with the token (what a connector holding the
  user's token would do);
* **internal API**: a real package connector (``benchapi``), spawned by ``python -m sidecar serve`` for a
  session, calls ``<daemon>/mcp/internal/benchapi/api/...`` with its own credential and the session's
  envelope; the daemon checks both, checks the path, attaches the token and forwards.

The grant is seeded into the daemon's credential store before it starts (a long-lived token, so no
refresh runs during the measurement; sign-in itself is tested, not benchmarked). Prints p50 and p99 of
each path and the difference. Target: the hop adds under 1 ms at p50.

    .venv/bin/python scripts/bench_internal.py            # 2000 calls per path
    .venv/bin/python scripts/bench_internal.py --quick    # 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import control_call, log, sidecar_daemon

TOKEN = "bench-access-token-" + "x" * 24
ISSUER = "https://auth.invalid"

CLIENT = '''
import asyncio, json, os, sys, time
import httpx2

def summary(samples):
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"n": len(ordered), "p50": ordered[len(ordered) // 2], "p99": p99}

async def measure(url, headers, n, warm):
    out = []
    async with httpx2.AsyncClient(timeout=30) as http:
        for i in range(warm + n):
            start = time.perf_counter()
            answer = await http.get(url, headers=headers)
            took = (time.perf_counter() - start) * 1000.0
            if answer.status_code != 200:
                raise SystemExit(f"call failed: {answer.status_code} {answer.text[:200]}")
            if i >= warm:
                out.append(took)
    return out

def main():
    if sys.argv[1] == "direct":
        url, token, n, warm = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(summary(asyncio.run(measure(url, {"Authorization": "Bearer " + token}, n, warm)))))
        return
    from mcp.server.mcpserver import MCPServer
    server = MCPServer("benchapi")

    @server.tool()
    async def run(n: int, warm: int) -> str:
        """n sequential GETs through the internal API; their p50 and p99 (ms) as JSON."""
        headers = {"Authorization": os.environ["API_AUTHORIZATION"], "X-Sidecar-Context": os.environ["API_CONTEXT"]}
        return json.dumps(summary(await measure(os.environ["API_BASE"] + "/items/1", headers, n, warm)))

    server.run()

main()
'''


def write_package(root: Path, upstream: str) -> None:
    directory = root / "benchapi"
    directory.mkdir(parents=True, mode=0o700)
    files: dict[str, str] = {
        "connector.json": json.dumps(
            {
                "id": "benchapi",
                "name": "Bench API",
                "description": "Benchmark connector",
                "version": "1",
                "type": "mcp",
                "tools": {"run": {"risk": "LOW"}},
            }
        ),
        "mcp.json": json.dumps(
            {
                "mcpServers": {
                    "benchapi": {
                        "command": "python3",
                        "args": ["${SIDECAR_CONNECTOR_ROOT}/server.py", "serve"],
                        "env": {
                            "API_BASE": "${SIDECAR_LOCAL_MCP_ORIGIN}/mcp/internal/benchapi/api",
                            "API_AUTHORIZATION": "${SIDECAR_LOCAL_MCP_AUTHORIZATION}",
                            "API_CONTEXT": "${SIDECAR_MCP_CONTEXT}",
                        },
                    }
                }
            }
        ),
        "oauth-client.json": json.dumps(
            {
                "authorization_endpoint": f"{ISSUER}/authorize",
                "token_endpoint": f"{ISSUER}/token",
                "client_id": "bench",
                "upstream": {"base_url": upstream, "paths": ["/items/"], "methods": ["GET"]},
            }
        ),
        "server.py": CLIENT,
    }
    for name, text in files.items():
        (directory / name).write_text(text)
        os.chmod(directory / name, 0o600)


async def seed_grant(data: Path) -> None:
    from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
    from pydantic import AnyUrl

    from sidecar.oauth.storage import CredentialTokenStorage
    from sidecar.store.credentials import CredentialStore, choose_key_source

    os.makedirs(data, mode=0o700, exist_ok=True)
    store = CredentialStore(
        data / "credentials.enc", choose_key_source(f"credentials:{data}", data / "credentials.key")
    )
    storage = CredentialTokenStorage(store, connector="benchapi", account="default")
    metadata = OAuthMetadata.model_validate(
        {"issuer": ISSUER, "authorization_endpoint": f"{ISSUER}/authorize", "token_endpoint": f"{ISSUER}/token"}
    )
    client = OAuthClientInformationFull(client_id="bench", redirect_uris=[AnyUrl("http://127.0.0.1/oauth/callback")])
    tokens = OAuthToken(access_token=TOKEN, token_type="Bearer")
    await storage.save_sign_in(ISSUER, client=client, tokens=tokens, authorization_server=metadata)


async def upstream() -> tuple[web.AppRunner, int]:
    body = json.dumps({"item": 1, "title": "a small upstream answer", "ok": True}).encode()

    async def item(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"message": "Bad credentials"}, status=401)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/items/{n}", item)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


def figures(name: str, measured: dict[str, Any]) -> tuple[float, float]:
    p50, p99 = float(measured["p50"]), float(measured["p99"])
    print(f"{name:<14} n={measured['n']:<5} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms")
    return p50, p99


async def run(n: int, warm: int) -> int:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    runner, port = await upstream()
    base = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-internal-") as tmp:
            work, home = Path(tmp), Path(tmp) / "home"
            from sidecar.paths import Paths

            paths = Paths.resolve({"SIDECAR_HOME": str(home)})
            await seed_grant(paths.data)
            write_package(paths.data / "connectors", base)
            script = paths.data / "connectors" / "benchapi" / "server.py"
            log(f"direct: {n} calls to the upstream with the token")
            direct_proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                "direct",
                f"{base}/items/1",
                TOKEN,
                str(n),
                str(warm),
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await asyncio.wait_for(direct_proc.communicate(), 600)
            if direct_proc.returncode != 0:
                raise SystemExit("the direct run failed")
            direct = json.loads(out)
            with sidecar_daemon(work, home) as (_proc, runtime):
                url, token = runtime["url"], runtime["control_token"]
                async with aiohttp.ClientSession() as http:
                    await control_call(http, url, token, "POST", "/control/connectors/benchapi/trust")
                    session = await control_call(
                        http,
                        url,
                        token,
                        "POST",
                        "/control/sessions",
                        {"workspace": str(work), "mode": "bypass", "allow": ["mcp__benchapi__*"]},
                    )
                log(f"internal API: {n} calls through the daemon from the connector process")
                async with (
                    httpx2.AsyncClient(headers=session["headers"], timeout=600) as client_http,
                    Client(streamable_http_client(session["url"], http_client=client_http), mode="legacy") as client,
                ):
                    result = await client.call_tool("mcp__benchapi__run", {"n": n, "warm": warm})
                text = "".join(getattr(block, "text", "") for block in result.content)
                if result.is_error:
                    raise SystemExit(f"the internal API run failed: {text}")
                through: dict[str, Any] = json.loads(text)
    finally:
        await runner.cleanup()
    d50, d99 = figures("direct", direct)
    i50, i99 = figures("internal API", through)
    hop = i50 - d50
    print(
        f"{'hop':<14} p50 +{hop:.3f} ms   p99 +{i99 - d99:.3f} ms   "
        f"(target: < 1 ms at p50: {'met' if hop < 1.0 else 'MISSED'})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 calls per path instead of 2000")
    args = parser.parse_args()
    n = 200 if args.quick else 2000
    return asyncio.run(run(n, warm=50))


if __name__ == "__main__":
    raise SystemExit(main())
