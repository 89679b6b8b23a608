"""``python -m sidecar.oauth.conformance_client <server-url>``: our OAuth client under the conformance suite.

The suite (``conformance client --command …``) appends the mock server's URL as the last argument and
sets ``MCP_CONFORMANCE_SCENARIO``, ``MCP_CONFORMANCE_CONTEXT`` (JSON, when the scenario has data) and
``MCP_CONFORMANCE_PROTOCOL_VERSION``. We connect, list the tools and call the first one with ``{}`` (the
step-up scenarios challenge only ``tools/call``), then exit 0; any failure exits 1.

Everything here is the production code path: the encrypted ``CredentialStore`` in a fresh temporary
home with a ``FileKey``, ``CredentialTokenStorage``, ``build_provider`` and the ``HeadlessDriver``
(the mock AS approves at once). Only what a scenario dictates is special:

- ``auth/pre-registration``: the context's ``client_id``/``client_secret`` are stored as the
  registration before the first request (the AS accepts only ``client_secret_basic``);
- a CIMD ``client_id`` URL is offered (``auth/basic-cimd``); it is used only where the AS advertises
  ``client_id_metadata_document_supported``, and need not resolve;
- the protocol era: ``2026-07-28`` runs the stateless modern client, anything else the handshake.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyUrl

from sidecar.oauth.flow import HeadlessDriver, build_provider, s256_guard
from sidecar.oauth.storage import CredentialTokenStorage
from sidecar.paths import Paths
from sidecar.store.credentials import CredentialStore, FileKey
from sidecar.store.files import ensure_private_dir

__all__ = ["main", "run"]

logger = logging.getLogger("sidecar.oauth.conformance_client")

REDIRECT_URI: Final = "http://localhost:3000/callback"
CIMD_URL: Final = "https://conformance-test.local/client-metadata.json"
MODERN_VERSION: Final = "2026-07-28"
HTTP_TIMEOUT: Final = 20.0
"""Seconds for any one HTTP exchange; the suite kills us at its own --timeout anyway."""


async def run(server_url: str, *, context: dict[str, Any], protocol_version: str | None, home: Path) -> None:
    """One scenario against ``server_url`` with a fresh credential store under ``home``."""
    paths = Paths.resolve({"SIDECAR_HOME": str(home)})
    ensure_private_dir(paths.data)
    store = CredentialStore(paths.data / "credentials.enc", FileKey(paths.data / "credentials.key"))
    storage = CredentialTokenStorage(store, connector="conformance", account="default")
    provider = build_provider(
        server_url,
        storage=storage,
        driver=HeadlessDriver(),
        redirect_uri=REDIRECT_URI,
        client_name="sidecar-conformance",
        client_metadata_url=CIMD_URL,
    )
    if context.get("client_id"):
        secret = context.get("client_secret")
        await storage.set_client_info(
            OAuthClientInformationFull(
                client_id=str(context["client_id"]),
                client_secret=secret,
                redirect_uris=[AnyUrl(REDIRECT_URI)],
                token_endpoint_auth_method="client_secret_basic" if secret else "none",
                issuer=context.get("issuer"),
            )
        )
    mode = MODERN_VERSION if protocol_version == MODERN_VERSION else "legacy"
    hooks = {"request": [s256_guard(provider)]}
    async with (
        httpx2.AsyncClient(auth=provider, timeout=HTTP_TIMEOUT, event_hooks=hooks) as http,
        Client(streamable_http_client(server_url, http_client=http), mode=mode) as client,
    ):
        tools = await client.list_tools()
        if tools.tools:
            await client.call_tool(tools.tools[0].name, {})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("sidecar.oauth").setLevel(logging.DEBUG)  # which records are written (never a token)
    if not argv:
        print("usage: python -m sidecar.oauth.conformance_client <server-url>", file=sys.stderr)
        return 2
    raw = os.environ.get("MCP_CONFORMANCE_CONTEXT")
    context = json.loads(raw) if raw else {}
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    logger.info("scenario %s against %s", scenario or "(none)", argv[-1])
    with tempfile.TemporaryDirectory(prefix="sidecar-conformance-") as home:
        try:
            asyncio.run(
                run(
                    argv[-1],
                    context=context if isinstance(context, dict) else {},
                    protocol_version=os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION"),
                    home=Path(home),
                )
            )
        except BaseException as exc:  # an ExceptionGroup from the SDK's task groups, too
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            logger.error("scenario %s failed: %s", scenario, _describe(exc))
            return 1
    return 0


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
