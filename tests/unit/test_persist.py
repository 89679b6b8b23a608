"""Sessions and route tokens outlive a restart until they expire; ends, rotations and expiry stay done.

Each "restart" here is a new journal, session store and route registry built from the same files, as
the next daemon builds them (``app._auth``); the daemon itself is restarted in ``tests/e2e/test_restart.py``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.auth.encoding import b64url_encode
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.persist import KEY_RECORD, StateJournal
from sidecar.auth.routes import RouteRegistry
from sidecar.auth.sessions import SessionStore
from sidecar.errors import EnvelopeRejected, Unauthorized
from sidecar.store import files
from sidecar.store.credentials import CredentialStore, FileKey

ROUTE = "connector-proxy"
NOW = 1_900_000_000.0


@dataclass
class Daemon:
    """What one daemon run holds of sessions and tokens, built from the files as ``app._auth`` builds it."""

    journal: StateJournal
    sessions: SessionStore
    routes: RouteRegistry


def _start(tmp_path: Path, clock: list[float], *routes: str) -> Daemon:
    credentials = CredentialStore(tmp_path / "data" / "credentials.enc", FileKey(tmp_path / "data" / "credentials.key"))
    journal = StateJournal(tmp_path / "state" / "sessions.json", credentials, clock=lambda: clock[0])
    restored = journal.load()
    inflight = InflightTracker()
    registry = RouteRegistry(inflight, journal=journal, carried=restored.tokens, clock=lambda: clock[0])
    store = SessionStore(
        inflight,
        keys=restored.keys,
        key_source=journal.signing_keys,
        journal=journal,
        restored=restored.sessions,
        default_ttl=3600,
        max_ttl=30 * 86400,
        clock=lambda: clock[0],
    )
    for name in routes or (ROUTE,):
        registry.register(name, path="/mcp")
    registry.drop_unclaimed()
    return Daemon(journal, store, registry)


def _stop(daemon: Daemon) -> None:
    """As the daemon stops: the journal closes, then everything ends in memory only."""
    daemon.journal.close()
    daemon.sessions.close_all()
    for route in daemon.routes.list():
        daemon.routes.unregister(route.name)


def _session(daemon: Daemon, workspace: Path, **kwargs: object) -> tuple[str, str, str]:
    """(session id, envelope, route token), as ``POST /control/sessions`` hands them out."""
    session, envelope = daemon.sessions.create(project_id="p", workspace=str(workspace), **kwargs)  # type: ignore[arg-type]
    return session.id, envelope, daemon.routes.issue(ROUTE, until=session.expires_at)


def _works(daemon: Daemon, envelope: str, token: str) -> bool:
    daemon.routes.authenticate(ROUTE, token)
    daemon.sessions.verify(envelope)
    return True


def test_a_session_and_its_token_work_after_a_restart_and_an_ended_one_stays_ended(tmp_path: Path) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    kept_id, kept, token = _session(first, tmp_path, label="kept one")
    ended_id, ended, _ = _session(first, tmp_path)
    first.sessions.end(ended_id)
    _stop(first)

    second = _start(tmp_path, clock)
    assert _works(second, kept, token)
    assert [(s.id, s.label) for s in second.sessions.list()] == [(kept_id, "kept one")]  # its label too
    with pytest.raises(EnvelopeRejected):
        second.sessions.verify(ended)
    # New sessions get the new run's token; the one handed out before the restart still opens the route.
    _, fresh, new_token = _session(second, tmp_path)
    assert new_token != token and _works(second, fresh, new_token) and _works(second, kept, token)


def test_nothing_secret_is_in_the_sessions_file_and_it_is_private(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    _, envelope, token = _session(daemon, tmp_path)
    raw = daemon.journal.path.read_text()
    assert token not in raw and envelope not in raw and envelope.split(".")[3] not in raw
    assert stat.S_IMODE(os.stat(daemon.journal.path).st_mode) == 0o600
    secret = CredentialStore(tmp_path / "data" / "credentials.enc", FileKey(tmp_path / "data" / "credentials.key"))
    assert secret.get(KEY_RECORD) is not None  # the key is in the credential store, sealed
    assert b"key" not in (tmp_path / "data" / "credentials.enc").read_bytes().split(b'"data"')[1]


def test_rotating_a_route_kills_the_tokens_of_earlier_runs_for_good(tmp_path: Path) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    _, envelope, token = _session(first, tmp_path)
    _stop(first)

    second = _start(tmp_path, clock)
    assert _works(second, envelope, token)
    second.routes.rotate(ROUTE)
    with pytest.raises(Unauthorized):
        second.routes.authenticate(ROUTE, token)
    _stop(second)

    third = _start(tmp_path, clock)
    with pytest.raises(Unauthorized):
        third.routes.authenticate(ROUTE, token)
    third.sessions.verify(envelope)  # the session lives on; its host needs the route's new token


def test_a_route_not_mounted_after_the_restart_loses_its_tokens(tmp_path: Path) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock, ROUTE, "connector:files")
    session, _ = first.sessions.create(project_id="p", workspace=str(tmp_path))
    token = first.routes.issue("connector:files", until=session.expires_at)
    _stop(first)

    second = _start(tmp_path, clock)  # the connector is no longer trusted: its route is not mounted
    _stop(second)
    third = _start(tmp_path, clock, ROUTE, "connector:files")  # trusted again later
    with pytest.raises(Unauthorized):
        third.routes.authenticate("connector:files", token)


def test_expiry_ends_sessions_and_tokens_across_a_restart(tmp_path: Path) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    _, short, token = _session(first, tmp_path, ttl=600)
    _, long, _ = _session(first, tmp_path, ttl=7200)
    _stop(first)

    clock[0] += 601
    second = _start(tmp_path, clock)
    with pytest.raises(EnvelopeRejected):
        second.sessions.verify(short)
    assert _works(second, long, token)  # the token lives while a session it went to does
    _stop(second)
    clock[0] += 7200
    third = _start(tmp_path, clock)
    assert third.sessions.list() == []
    with pytest.raises(Unauthorized):
        third.routes.authenticate(ROUTE, token)


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"version": 3, "kid": null, "mac": null, "sessions": [], "tokens": {}}', b"[]", b'{"version": 2}'],
    ids=["not-json", "other-version", "not-an-object", "missing-members"],
)
def test_a_corrupt_file_starts_clean_with_a_log_line(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    _, envelope, token = _session(first, tmp_path)
    _stop(first)
    first.journal.path.write_bytes(content)

    with caplog.at_level(logging.WARNING, logger="sidecar.auth.persist"):
        second = _start(tmp_path, clock)
    assert "starting with no sessions from before the restart" in caplog.text
    assert second.sessions.list() == []
    with pytest.raises(EnvelopeRejected):
        second.sessions.verify(envelope)
    with pytest.raises(Unauthorized):
        second.routes.authenticate(ROUTE, token)
    _session(second, tmp_path)  # and it works on, writing a good file again
    assert json.loads(second.journal.path.read_text())["version"] == 2


def test_a_lost_key_starts_clean(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    _, envelope, _ = _session(first, tmp_path)
    _stop(first)
    (tmp_path / "data" / "credentials.enc").unlink()

    with caplog.at_level(logging.WARNING, logger="sidecar.auth.persist"):
        second = _start(tmp_path, clock)
    assert "envelope key" in caplog.text
    assert second.sessions.list() == []
    with pytest.raises(EnvelopeRejected):
        second.sessions.verify(envelope)


@contextlib.contextmanager
def _out_of_descriptors() -> Iterator[list[int]]:
    """The seam: every temp file ``write_atomic`` opens (relative to its directory) fails with EMFILE."""
    real_open = files.os.open
    failed: list[int] = []

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None:
            failed.append(flags)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files.os, "open", open_)
        yield failed


def _directory(path: Path) -> dict[str, bytes]:
    return {entry.name: entry.read_bytes() for entry in sorted(path.iterdir())}


def test_a_write_that_fails_leaves_the_file_as_it_was_and_is_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    ended_id, ended, _ = _session(daemon, tmp_path)
    kept_id, kept, token = _session(daemon, tmp_path)
    state = daemon.journal.path.parent
    before = _directory(state)
    with _out_of_descriptors() as failed, caplog.at_level(logging.ERROR, logger="sidecar.auth.persist"):
        daemon.sessions.end(ended_id)
        assert not daemon.journal.flush()  # still out of descriptors: still pending
    assert failed, "the seam was not reached"
    assert "keeps its previous contents" in caplog.text
    assert _directory(state) == before  # the previous file byte for byte, and no temp file left behind
    assert daemon.journal.unsaved

    assert daemon.journal.flush()  # descriptors are back: the retry writes the whole current state
    assert not daemon.journal.unsaved
    _stop(daemon)
    again = _start(tmp_path, clock)
    assert [s.id for s in again.sessions.list()] == [kept_id] and _works(again, kept, token)
    with pytest.raises(EnvelopeRejected):
        again.sessions.verify(ended)


def test_a_revocation_still_unwritten_at_the_stop_is_set_aside_so_nothing_ended_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    session_id, envelope, _ = _session(daemon, tmp_path)
    on_disk = daemon.journal.path.read_bytes()
    with _out_of_descriptors(), caplog.at_level(logging.ERROR, logger="sidecar.auth.persist"):
        daemon.sessions.end(session_id)
        assert daemon.journal.path.read_bytes() == on_disk  # kept while the write may still succeed
        _stop(daemon)
    assert "set aside" in caplog.text
    assert not daemon.journal.path.exists()
    assert (daemon.journal.path.parent / "sessions.json.unsaved").read_bytes() == on_disk  # moved, not deleted
    again = _start(tmp_path, clock)
    assert again.sessions.list() == []
    with pytest.raises(EnvelopeRejected):
        again.sessions.verify(envelope)


def test_a_new_session_still_unwritten_at_the_stop_leaves_the_file_in_place(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    kept_id, kept, token = _session(daemon, tmp_path)
    on_disk = daemon.journal.path.read_bytes()
    with _out_of_descriptors():
        _session(daemon, tmp_path)
        _stop(daemon)
    assert daemon.journal.path.read_bytes() == on_disk
    again = _start(tmp_path, clock)
    assert [s.id for s in again.sessions.list()] == [kept_id] and _works(again, kept, token)


def test_an_unsafe_directory_costs_no_file_until_a_revocation_must_be_kept(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    session_id, envelope, _ = _session(daemon, tmp_path)
    state = daemon.journal.path.parent
    on_disk = daemon.journal.path.read_bytes()
    state.chmod(0o777)  # others may write: sidecar refuses to write there
    try:
        daemon.sessions.end(session_id)
        assert daemon.journal.path.read_bytes() == on_disk and daemon.journal.unsaved
        _stop(daemon)
    finally:
        state.chmod(0o700)
    again = _start(tmp_path, clock)
    with pytest.raises(EnvelopeRejected):
        again.sessions.verify(envelope)


def test_an_envelope_key_the_store_refused_is_stored_before_the_file_is_written(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    store = daemon.journal._credentials
    real_put = store.put
    store_down = [True]

    def put(record: Any, secret: Any, *, generation: int) -> None:
        if store_down[0]:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        real_put(record, secret, generation=generation)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "put", put)
        session_id, envelope, token = _session(daemon, tmp_path)
        assert daemon.journal.unsaved and not daemon.journal.path.exists()  # nothing sealed under an unstored key
        store_down[0] = False
        assert daemon.journal.flush()
    _stop(daemon)
    again = _start(tmp_path, clock)
    assert [s.id for s in again.sessions.list()] == [session_id] and _works(again, envelope, token)


def test_stopping_ends_nothing_on_disk(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    _session(daemon, tmp_path)
    before = daemon.journal.path.read_bytes()
    _stop(daemon)
    assert daemon.journal.path.read_bytes() == before


def test_no_key_is_read_or_made_until_a_session_needs_one(tmp_path: Path) -> None:
    clock = [NOW]
    daemon = _start(tmp_path, clock)
    assert not (tmp_path / "data" / "credentials.key").exists()  # no keyring asked, no key file made
    with pytest.raises(EnvelopeRejected):
        daemon.sessions.verify("v1.abc.e30.AAAA")
    _session(daemon, tmp_path)
    assert (tmp_path / "data" / "credentials.key").exists()


def _edited(tmp_path: Path, change: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture) -> Daemon:
    """A daemon started after ``change`` was made to the file a first run left."""
    clock = [NOW]
    first = _start(tmp_path, clock)
    _session(first, tmp_path)
    _stop(first)
    document = json.loads(first.journal.path.read_text())
    change(document)
    first.journal.path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="sidecar.auth.persist"):
        return _start(tmp_path, clock)


def test_an_ended_session_put_back_by_hand_is_refused_with_the_whole_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [NOW]
    first = _start(tmp_path, clock)
    _, kept, token = _session(first, tmp_path)
    ended_id, ended, _ = _session(first, tmp_path)
    before_end = json.loads(first.journal.path.read_text())
    first.sessions.end(ended_id)
    _stop(first)
    after_end = json.loads(first.journal.path.read_text())
    after_end["sessions"] = before_end["sessions"]  # the ended session back, the MAC left as it was
    first.journal.path.write_text(json.dumps(after_end))

    with caplog.at_level(logging.WARNING, logger="sidecar.auth.persist"):
        second = _start(tmp_path, clock)
    assert "changed outside the daemon" in caplog.text
    assert second.sessions.list() == []  # refused as a whole: the untouched session is gone too
    for envelope in (kept, ended):
        with pytest.raises(EnvelopeRejected):
            second.sessions.verify(envelope)
    with pytest.raises(Unauthorized):
        second.routes.authenticate(ROUTE, token)


def test_a_token_digest_added_by_hand_opens_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    planted = "planted-token-" + "x" * 30
    digest = b64url_encode(hashlib.sha256(planted.encode()).digest())

    def plant(document: dict[str, Any]) -> None:
        document["tokens"][ROUTE].append({"digest": digest, "until": int(NOW) + 3600})

    second = _edited(tmp_path, plant, caplog)
    assert "changed outside the daemon" in caplog.text
    with pytest.raises(Unauthorized):
        second.routes.authenticate(ROUTE, planted)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d.update(mac=None), id="mac-removed"),
        pytest.param(lambda d: d.update(version=1) or d.pop("mac"), id="unsealed-version-1"),
        pytest.param(lambda d: d.update(mac="A" * 43), id="mac-replaced"),
        pytest.param(lambda d: d["sessions"][0].update(mode="bypass"), id="mode-widened"),
    ],
)
def test_a_file_not_sealed_by_the_daemon_starts_clean(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    second = _edited(tmp_path, change, caplog)
    assert "starting with no sessions from before the restart" in caplog.text
    assert second.sessions.list() == []
