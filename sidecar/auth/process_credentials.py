"""Internal-API credentials (contract §4, §7): one per connector process, bound to its connector and session.

A connector process reaches its upstream API only through the daemon's internal API,
``/mcp/internal/<id>/api/<path>``, with ``Authorization: Bearer <credential>`` (its
``${SIDECAR_LOCAL_MCP_AUTHORIZATION}``) and the session's envelope. The credential is minted when the
process is spawned (32 random bytes, base64url) and is valid only:

- on the internal route of the connector it was minted for (any other route knows nothing of it);
- with the envelope of the session it was minted for;
- until it is revoked: when its process exits, its session ends, its connector is untrusted or
  signed out (``revoke_connector``) — whichever comes first. Revoking aborts every upstream request
  still running on it (``InflightTracker``), and a revoked credential is forgotten: a replay is a 401
  like any unknown token.

Credentials are looked up by SHA-256 digest and compared in constant time; the token itself is handed
to the launcher once and never stored, logged or written here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sidecar.auth.encoding import mint_token, token_digest
from sidecar.auth.inflight import InflightTracker
from sidecar.errors import Unauthorized

__all__ = ["ProcessCredential", "ProcessCredentials"]

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class ProcessCredential:
    """What a credential is bound to; ``revoked`` once any of it ends."""

    connector_id: str
    session_id: str
    digest: bytes = field(repr=False)
    revoked: bool = False

    @property
    def key(self) -> Hashable:
        """The in-flight key of the requests running on this credential."""
        return ("internal-credential", self.digest)


class ProcessCredentials:
    """Mint, check and revoke the internal-API credentials of connector processes."""

    def __init__(self, inflight: InflightTracker) -> None:
        self._inflight = inflight
        self._by_digest: dict[bytes, ProcessCredential] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def mint(self, connector_id: str, session_id: str) -> tuple[str, Callable[[], None]]:
        """A new credential for a process of ``connector_id`` in ``session_id``: (token, release).

        ``release`` revokes it; the launcher calls it when the process exits."""
        token = mint_token()
        digest = token_digest(token)
        credential = ProcessCredential(connector_id, session_id, digest)
        self._by_digest[digest] = credential
        return token, lambda: self.revoke(credential)

    def check(self, token: str | None, connector_id: str) -> ProcessCredential:
        """The live credential ``token`` names on ``connector_id``'s internal route, or ``Unauthorized``."""
        if not token:
            raise Unauthorized("the internal API needs Authorization: Bearer <this process's credential>")
        try:
            digest = token_digest(token)
        except ValueError:
            raise Unauthorized("not a valid internal API credential") from None
        # SECURITY: found by its SHA-256 digest (a revoked one is no longer there), so lookup timing says
        # nothing about the token; a credential of another connector is as good as none.
        credential = self._by_digest.get(digest)
        if credential is None or credential.connector_id != connector_id:
            raise Unauthorized("not a valid internal API credential for this connector")
        return credential

    @contextmanager
    def call(self, credential: ProcessCredential, abort: Callable[[], None]) -> Iterator[None]:
        """Track one request on ``credential``: revoking it calls ``abort``."""
        keys = (credential.key, ("internal-connector", credential.connector_id), ("session", credential.session_id))
        with self._inflight.track(keys, abort):
            yield

    def revoke(self, credential: ProcessCredential) -> None:
        if credential.revoked:
            return
        credential.revoked = True
        self._by_digest.pop(credential.digest, None)
        aborted = self._inflight.abort(credential.key)
        logger.debug("internal API credential of %s revoked (%d calls aborted)", credential.connector_id, aborted)

    def revoke_connector(self, connector_id: str) -> int:
        """Every credential of ``connector_id`` (untrusted, signed out, removed); returns how many."""
        return self._revoke_where(lambda c: c.connector_id == connector_id)

    def revoke_session(self, session_id: str) -> int:
        return self._revoke_where(lambda c: c.session_id == session_id)

    def _revoke_where(self, match: Callable[[ProcessCredential], bool]) -> int:
        found = [c for c in self._by_digest.values() if match(c)]
        for credential in found:
            self.revoke(credential)
        return len(found)
