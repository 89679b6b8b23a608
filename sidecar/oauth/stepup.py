"""Step-up: a remote server refuses one call for want of scope, and the next sign-in asks for more.

A server that wants more access for one operation answers ``403`` with an RFC 6750 challenge,
``Bearer error="insufficient_scope", scope="…"`` (MCP authorization, "Scope Challenge Handling"). The
SDK's provider would re-authorize inline, inside the request; sidecar signs in out of band only, so:

- the call fails at once with a JSON-RPC error that names the missing scope and the command to run,
  and the connection stays up: the grant still serves everything it covers;
- the connector keeps ``auth: ready`` and says in ``auth_reason`` that a sign-in would widen it;
- the next sign-in asks for the union of what was granted, what the user configured and every scope a
  call was refused for (SEP-2350: escalating one operation must not drop another's grant);
- at most ``MAX_SIGN_INS`` sign-ins per challenge: a server that still refuses after that is not
  missing a scope sidecar can ask for, and the message stops suggesting a sign-in.
"""

from __future__ import annotations

import json
from typing import Final

import httpx2
from mcp.client.auth.utils import extract_field_from_www_auth, extract_scope_from_www_auth, union_scopes

__all__ = ["MAX_SIGN_INS", "NEEDS_SIGN_IN", "StepUp", "answer_with_error", "scope_challenge"]

MAX_SIGN_INS: Final = 3
NEEDS_SIGN_IN: Final = -32001
"""JSON-RPC error code (server-defined range) of a call refused until the user signs in again."""


def scope_challenge(response: httpx2.Response) -> str | None:
    """The scope a ``403 insufficient_scope`` Bearer challenge asks for ("" when it names none); None
    when ``response`` is not such a challenge (parsed as the SDK's own step-up parses it)."""
    if response.status_code != 403 or extract_field_from_www_auth(response, "error") != "insufficient_scope":
        return None
    return " ".join((extract_scope_from_www_auth(response) or "").split())


async def answer_with_error(response: httpx2.Response, message: str) -> None:
    """Turn the server's refusal into a JSON-RPC error carrying ``message``, which the SDK's client hands
    to the caller as this request's error (it reads JSON-RPC errors from non-2xx bodies); the server's
    own body is discarded unread and its connection released."""
    stream = response.stream
    if isinstance(stream, httpx2.AsyncByteStream):
        await stream.aclose()
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": NEEDS_SIGN_IN, "message": message}})
    data = body.encode()
    response.headers["content-type"] = "application/json"
    response.headers["content-length"] = str(len(data))
    response.headers.pop("content-encoding", None)
    response.stream = httpx2.ByteStream(data)


class StepUp:
    """One connector's scope refusals: what the next sign-in must add, and how often it was tried."""

    def __init__(self, connector_id: str) -> None:
        self.connector_id = connector_id
        self.wanted: str | None = None
        """Every scope a call was refused for since the last sign-in that granted them."""
        self._pending: set[str] = set()
        self._sign_ins: dict[str, int] = {}

    def refused(self, challenged: str, granted: str | None) -> str:
        """A call was refused for want of ``challenged``: remember it, and say what the user can do."""
        cid = self.connector_id
        key = challenged or "(unnamed)"
        if self._sign_ins.get(key, 0) >= MAX_SIGN_INS:
            return (
                f"connector {cid} refused this call for want of scope {challenged!r} after {MAX_SIGN_INS} "
                "sign-ins that asked for it; a new sign-in will not help (check the account's permissions)"
            )
        self._pending.add(key)
        self.wanted = union_scopes(union_scopes(self.wanted, granted), challenged or None)
        needed = f"scope {challenged!r}" if challenged else "more access"
        return f"connector {cid} needs {needed} for this call: run sidecar connectors connect {cid}"

    def reason(self) -> str | None:
        """``auth_reason`` while a sign-in would widen the grant."""
        if self.wanted is None:
            return None
        return f"some calls need scope {self.wanted!r}: run sidecar connectors connect {self.connector_id}"

    def scope_for_sign_in(self, granted: str | None, configured: str | None) -> str | None:
        """What a sign-in starting now adds to the server's own challenge; counts it against each refusal."""
        for key in self._pending:
            self._sign_ins[key] = self._sign_ins.get(key, 0) + 1
        self._pending.clear()
        return union_scopes(union_scopes(configured, granted if self.wanted else None), self.wanted)

    def signed_in(self, granted: str | None) -> None:
        """A sign-in completed: what it granted no longer needs asking for."""
        have = set((granted or "").split())
        if self.wanted is not None and set(self.wanted.split()) <= have:
            self.wanted = None
