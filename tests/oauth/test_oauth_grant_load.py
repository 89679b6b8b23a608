"""What a grant loaded from the store says about the sign-in (the state a restarted daemon shows)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mcp.shared.auth import OAuthToken

from sidecar.oauth.broker import Broker
from sidecar.oauth.storage import StoredGrant
from sidecar.store.credentials import RecordId
from tests.oauth.fakes import ISSUER, open_store


def _broker(tmp_path: Path, **grants: StoredGrant) -> Broker:
    store = open_store(tmp_path)
    for connector, grant in grants.items():
        store.put(
            RecordId(connector, "default", ISSUER), grant.model_dump(mode="json", exclude_none=True), generation=0
        )
    return Broker(store, redirect_uri=lambda: "http://127.0.0.1:1/oauth/callback", audit=lambda *a, **k: None)


def _tokens(*, refresh: bool, expires_in: float) -> Callable[[], StoredGrant]:
    """A grant made when the test runs (not when it is collected: a long run would expire it first)."""

    def make() -> StoredGrant:
        now = time.time()
        token = OAuthToken(access_token="at", refresh_token="rt" if refresh else None, expires_in=3600)
        return StoredGrant(tokens=token, expires_at=now + expires_in, issued_at=now - 10, saved_at=now)

    return make


@pytest.mark.parametrize(
    ("make", "declared", "state"),
    [
        (_tokens(refresh=True, expires_in=-100), False, "ready"),  # expired, but refreshable
        (_tokens(refresh=False, expires_in=600), False, "ready"),  # live access token
        (_tokens(refresh=False, expires_in=-100), False, "unauthorized"),  # expired for good
        (lambda: StoredGrant(saved_at=1.0), False, "unauthorized"),  # a client was registered: the server asked
        (None, True, "unauthorized"),  # the config names a client
        (None, False, "none"),  # nothing known yet: the first call tells
    ],
)
async def test_a_loaded_grant_sets_the_sign_in_state(
    tmp_path: Path, make: Callable[[], StoredGrant] | None, declared: bool, state: str
) -> None:
    grant = make() if make is not None else None
    broker = _broker(tmp_path, **({"c": grant} if grant is not None else {}))
    await broker.load({"c": declared})
    assert broker.public("c")["auth"] == state
