"""check_token: the one bearer-token check of the control API and the route tokens."""

from __future__ import annotations

import pytest

from sidecar.auth.encoding import check_token, mint_token, token_digest
from sidecar.errors import Unauthorized


def test_the_token_whose_digest_is_expected_passes() -> None:
    token = mint_token()
    check_token(token, token_digest(token), what="control token")


@pytest.mark.parametrize(
    ("presented", "message"),
    [(None, "missing control token"), ("tökén", "malformed control token"), ("A" * 43, "invalid control token")],
)
def test_a_missing_non_ascii_or_other_token_is_unauthorized_and_says_which(presented: str | None, message: str) -> None:
    token = mint_token()
    with pytest.raises(Unauthorized) as refused:
        check_token(presented, token_digest(token), what="control token")
    assert str(refused.value) == message
