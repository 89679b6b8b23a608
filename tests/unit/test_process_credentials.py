"""Internal-API credentials: bound to one connector and session, revoked by any of process, session, connector."""

from __future__ import annotations

import pytest

from sidecar.auth.encoding import b64url_decode
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.process_credentials import ProcessCredentials
from sidecar.errors import Unauthorized


def test_a_credential_is_32_random_bytes_valid_only_on_its_own_connector() -> None:
    credentials = ProcessCredentials(InflightTracker())
    token, _ = credentials.mint("github", "s1")
    other, _ = credentials.mint("github", "s1")
    assert len(b64url_decode(token)) == 32 and token != other
    found = credentials.check(token, "github")
    assert (found.connector_id, found.session_id) == ("github", "s1")
    with pytest.raises(Unauthorized):
        credentials.check(token, "slack")  # another connector's route
    for wrong in (None, "", "x" * 43, "é"):
        with pytest.raises(Unauthorized):
            credentials.check(wrong, "github")


def test_release_session_end_and_withdrawal_each_revoke_and_abort_what_runs() -> None:
    inflight = InflightTracker()
    credentials = ProcessCredentials(inflight)
    by_process, release = credentials.mint("github", "s1")
    by_session, _ = credentials.mint("github", "s2")
    by_connector, _ = credentials.mint("slack", "s3")
    aborted: list[str] = []
    with credentials.call(credentials.check(by_process, "github"), lambda: aborted.append("process")):
        release()
        assert aborted == ["process"]
    with credentials.call(credentials.check(by_session, "github"), lambda: aborted.append("session")):
        assert credentials.revoke_session("s2") == 1
    with credentials.call(credentials.check(by_connector, "slack"), lambda: aborted.append("connector")):
        assert credentials.revoke_connector("slack") == 1
    assert aborted == ["process", "session", "connector"]
    for token, connector in ((by_process, "github"), (by_session, "github"), (by_connector, "slack")):
        with pytest.raises(Unauthorized):
            credentials.check(token, connector)  # a replay after revocation
    assert len(credentials) == 0
