"""A revoke wins over a refresh already in flight (issue 24), raced many times through the real daemon.

Against panva's ``oidc-provider`` (``tests/oauth_as``) with three-second access tokens, each round signs in,
lets the access token expire, starts calls (the daemon refreshes once) and, once the AS has the refresh
request (which it answers ``HOLD_MS`` late), revokes through the control API at a different offset each
round: before the tokens reach the daemon, or just after. It fails on the first round where
anything is left: a call that works after the revoke, a record in the credential store (what a restart
reads; the daemon is also restarted every ``RESTART_EVERY`` rounds and must come back ``unauthorized``),
or any token the AS ever issued for the round's grant still active at its introspection endpoint.

The AS revokes only the token named (``TOKEN_ONLY_REVOCATION``), as RFC 7009 allows: the daemon must
revoke every token it holds, the ones a racing refresh obtained too, not count on the AS ending the grant.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Daemon, mcp_client, running_daemon
from tests.e2e.test_oauth_broker import BOUND, Servers, _stored_records, oauth_servers, sign_in
from tests.helpers import tool_text, write_user_servers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # fifty rounds of a few seconds each

ROUNDS = 50
RESTART_EVERY = 10
CALLS = 3
HOLD_MS = 100
OFFSETS = [step * 0.015 for step in range(10)]
"""Seconds between the AS getting the refresh request and the revoke, one per round in turn: 0 to 135 ms,
so most revokes land while the AS holds its answer and some after the daemon got it."""


def _events(servers: Servers) -> list[dict[str, Any]]:
    return [json.loads(x) for x in servers.events.read_text().splitlines() if x.startswith("{")]


def _issued(servers: Servers) -> list[str]:
    """Every token the AS issued so far (its event log, ``LOG_TOKENS``)."""
    return [token for e in _events(servers) if e["event"] == "grant" for token in e.get("tokens") or ()]


def _token_requests(servers: Servers) -> int:
    return sum(1 for e in _events(servers) if e["event"] == "token_request")


def _revocations(servers: Servers) -> int:
    return sum(1 for e in _events(servers) if e["event"] == "revocation")


async def _until_expired(servers: Servers, token: str) -> None:
    async with asyncio.timeout(BOUND):
        while (await servers.introspect(token))["active"]:
            await asyncio.sleep(0.05)


async def _until_remote_revoked(daemon: Daemon) -> None:
    """The revoke said ``retrying``: wait (bounded) until its background revocation reports success."""
    async with asyncio.timeout(BOUND):
        while not any(e.get("remote") == "revoked" for e in daemon.audit_events("oauth.revoke")[-1:]):
            await asyncio.sleep(0.1)


async def _not_signed_in_after_a_restart(daemon: Daemon, shown: dict[str, Any], when: str) -> None:
    """What the store holds after a revoke signs nothing in: no sign-in state (the revoke took the client
    registration too, so the server has not asked yet) or ``unauthorized``, and a call fails."""
    assert shown["auth"] in ("none", "unauthorized"), f"{when}: {shown}"
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    async with asyncio.timeout(BOUND), mcp_client(session) as client:
        result = await client.call_tool("mcp__remote__echo", {"text": "restarted"})
    assert result.is_error, f"{when}: a call worked"


async def _race_one_round(daemon: Daemon, servers: Servers, number: int) -> str:
    before, revocations = len(_issued(servers)), _revocations(servers)
    await sign_in(daemon)
    session = await daemon.new_session(mode="bypass", allow=["mcp__remote__*"])
    async with asyncio.timeout(4 * BOUND), mcp_client(session) as client:
        assert tool_text(await client.call_tool("mcp__remote__echo", {"text": "warm"})) == "warm"
        await _until_expired(servers, _issued(servers)[-2])  # the access token of this round's sign-in

        requests = _token_requests(servers)
        calls = asyncio.gather(
            *(client.call_tool("mcp__remote__echo", {"text": str(i)}) for i in range(CALLS)), return_exceptions=True
        )
        async with asyncio.timeout(BOUND):  # the AS has the refresh request (and holds its answer)
            while _token_requests(servers) == requests:
                await asyncio.sleep(0.002)
        await asyncio.sleep(OFFSETS[number % len(OFFSETS)])  # not to synchronise: where in the hold it lands
        revoked = await daemon.control("POST", "/control/connectors/remote/revoke")
        late = await client.call_tool("mcp__remote__echo", {"text": "late"})
        assert late.is_error, f"round {number}: a call after the revoke worked"
        await calls  # every racing call has ended, with whatever the refresh got
        again = await client.call_tool("mcp__remote__echo", {"text": "again"})
        assert again.is_error, f"round {number}: a call after the racing calls ended worked"

    assert _stored_records(daemon) == [], f"round {number}: the credential store still holds the grant"
    shown = await daemon.control("GET", "/control/connectors/remote")
    assert shown["auth"] == "unauthorized", f"round {number}: {shown}"
    if revoked["remote"] == "retrying":
        await _until_remote_revoked(daemon)
    else:
        assert revoked["remote"] == "revoked", f"round {number}: {revoked}"
    issued = _issued(servers)[before:]
    refreshed = len(issued) > 2  # the sign-in's two tokens, and two more per refresh
    for token in issued:
        assert (await servers.introspect(token))["active"] is False, (
            f"round {number}: a token the AS issued is still active (refreshed in this round: {refreshed})"
        )
    if not refreshed:
        return "revoked before any refresh"
    if _revocations(servers) - revocations > 2:  # the deleted record's pair and the discarded refresh's
        return "refresh in flight, its result discarded and revoked"
    return "refresh stored before the revoke, deleted and revoked with it"


async def test_a_revoke_racing_refreshes_leaves_nothing_usable_stored_or_active(
    home: Path, workspace: Path, tmp_path: Path
) -> None:
    from sidecar.paths import Paths

    outcomes: dict[str, int] = {}
    # Three-second access tokens: the AS counts whole seconds (exp = floor(now) + AT_TTL), so one lives
    # between AT_TTL - 1 and AT_TTL seconds, and the sign-in's retried request must reach the resource
    # server inside that; at 2 a CI machine under load once took longer (a 401 after a fresh token).
    race = {"AT_TTL": "3", "LOG_TOKENS": "1", "TOKEN_ONLY_REVOCATION": "1", "TOKEN_DELAY_MS": str(HOLD_MS)}
    with oauth_servers(tmp_path, **race) as servers:
        for first in range(0, ROUNDS, RESTART_EVERY):
            async with running_daemon(Paths.resolve(), workspace) as daemon:
                shown = await daemon.control("GET", "/control/connectors/remote", expect=None)
                if first == 0:
                    write_user_servers(daemon, {"remote": {"type": "http", "url": servers.mcp_url}})
                    await daemon.control("POST", "/control/connectors/remote/trust")
                else:
                    await _not_signed_in_after_a_restart(daemon, shown, f"after a restart at round {first}")
                for number in range(first, first + RESTART_EVERY):
                    outcome = await _race_one_round(daemon, servers, number)
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
        async with running_daemon(Paths.resolve(), workspace) as daemon:
            shown = await daemon.control("GET", "/control/connectors/remote")
            await _not_signed_in_after_a_restart(daemon, shown, "after the last restart")
    print(f"{ROUNDS} rounds: {outcomes}")
