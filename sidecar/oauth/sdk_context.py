"""The one place sidecar reaches into the SDK's ``OAuthContext``: what it discovered, and restoring it.

``mcp.client.auth.oauth2.OAuthClientProvider._initialize`` loads only the tokens and the client
registration from ``TokenStorage``. It restores neither the tokens' expiry nor the authorization
server's metadata, so after a restart an expired access token is sent as is, the 401 goes straight to
interactive authorization, and a forced refresh goes to ``{resource origin}/token`` instead of the
discovered token endpoint (python-sdk#3250, open in 2.3.0; the fix PRs #2492 and #3328 did not land).

Seeding three fields of ``provider.context`` closes the gap (verified against 2.3.0, and pinned by
``tests/oauth/test_sdk_context.py``, which fails when an SDK upgrade renames or reshapes them):

- ``token_expiry_time``: the absolute expiry (epoch seconds) ``is_token_valid`` compares with
  ``time.time()``; an expired token with a refresh token makes the next request refresh first;
- ``oauth_metadata``: where ``_refresh_token`` finds the token endpoint;
- ``protected_resource_metadata``: what makes the refresh carry RFC 8707 ``resource``
  (``should_include_resource_param``) with the PRM's canonical value (``get_resource_url``).

The fields are public attributes of a public dataclass, but not a documented API: nothing else in
sidecar may touch them. Delete this module when the SDK persists them itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.client.auth.oauth2 import OAuthContext
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata

__all__ = ["Discovered", "discovered", "restore"]


@dataclass(frozen=True, slots=True)
class Discovered:
    """What the provider learned about a server: its authorization server's and its own metadata."""

    authorization_server: OAuthMetadata | None = None
    protected_resource: ProtectedResourceMetadata | None = None


def discovered(context: OAuthContext) -> Discovered:
    """The metadata the provider holds now (after discovery, or as restored)."""
    return Discovered(context.oauth_metadata, context.protected_resource_metadata)


def restore(context: OAuthContext, *, expires_at: float | None, metadata: Discovered) -> None:
    """Seed a provider that is loading stored tokens with their expiry and the metadata saved with them.

    ``expires_at`` always replaces the expiry: it belongs to the tokens being loaded. Metadata is set
    only where the provider has none, so a fresher discovery in this process is never overwritten.
    """
    context.token_expiry_time = expires_at
    if context.oauth_metadata is None:
        context.oauth_metadata = metadata.authorization_server
    if context.protected_resource_metadata is None:
        context.protected_resource_metadata = metadata.protected_resource
