"""Starting a sign-in from what a connector's config declares: the one way the control API and the
web console's **Connect** begin one (through ``control.start_sign_in``).

- ``sign_in_remote``: a remote MCP server, with the ``OAuthClient`` its ``mcp.json`` entry names (its
  secret read from its file now), or none (the SDK's provider registers one);
- ``sign_in_provider``: a package's provider (``oauth-client.json``), as the client the user gives
  (``connect --client-id``, ``--client-secret-file``), else the package's own, else the one the user
  gave at the last sign-in.

A secret is read with ``read_private`` and goes only to the broker: never logged, audited or echoed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from sidecar.errors import AuthorizationRefused, RequestRejected, StorageError
from sidecar.oauth.broker import Broker
from sidecar.oauth.declared import OAuthClient, PreRegistered, Provider
from sidecar.oauth.provider import ProviderClient
from sidecar.store.files import read_private

__all__ = ["read_secret", "sign_in_provider", "sign_in_remote"]

_MAX_SECRET_BYTES: Final = 4096
"""A client secret file holds one secret: anything longer is the wrong file."""


async def sign_in_remote(
    broker: Broker, connector_id: str, *, url: str, headers: Mapping[str, str], client: OAuthClient | None
) -> dict[str, Any]:
    """Start (or join) the sign-in of a remote MCP server (``Broker.connect``)."""
    return await broker.connect(
        connector_id, url=url, headers=headers, client=await _pre_registered(connector_id, client)
    )


async def sign_in_provider(
    broker: Broker,
    connector_id: str,
    provider: Provider,
    *,
    client_id: str | None = None,
    client_secret_file: str | None = None,
) -> dict[str, Any]:
    """Start (or join) the sign-in of a package's provider (``Broker.connect_provider``)."""
    secret = None
    if client_secret_file is not None:
        if not client_secret_file.startswith("/"):
            raise RequestRejected("client_secret_file must be an absolute path")
        secret = await read_secret(connector_id, Path(client_secret_file))
    if client_id is None and secret is None:  # a sign-in again: the client the user gave last time
        stored = await broker.keeper(connector_id).storage_grant()
        if stored is not None and stored.client is not None and not provider.client_id:
            client_id, secret = stored.client.client_id, stored.client.client_secret
    try:
        chosen = ProviderClient.of(connector_id, provider, client_id=client_id, client_secret=secret)
    except AuthorizationRefused as exc:
        raise RequestRejected(str(exc)) from None
    return await broker.connect_provider(connector_id, chosen)


async def _pre_registered(connector_id: str, client: OAuthClient | None) -> PreRegistered | None:
    """The entry's ``oauth`` client, its secret read from its file now."""
    if client is None:
        return None
    secret = await read_secret(connector_id, client.secret_file) if client.secret_file is not None else None
    return PreRegistered(client.client_id, secret, client.scopes, metadata_document=client.metadata_document)


async def read_secret(connector_id: str, path: Path) -> str:
    """A client secret from a file only the user can read; ``RequestRejected`` naming the file otherwise."""
    try:
        # SECURITY: read_private refuses a file that is not ours, is group/world accessible, or a link.
        raw = await asyncio.to_thread(read_private, path, max_bytes=_MAX_SECRET_BYTES)
        secret = raw.decode("utf-8").strip()
    except FileNotFoundError:
        raise RequestRejected(f"connector {connector_id}: the client secret file {path} is missing") from None
    except (StorageError, UnicodeDecodeError) as exc:
        why = str(exc) if isinstance(exc, StorageError) else "it is not UTF-8 text"
        raise RequestRejected(f"connector {connector_id}: cannot use the client secret file: {why}") from None
    if not secret:
        raise RequestRejected(f"connector {connector_id}: the client secret file {path} is empty")
    return secret
