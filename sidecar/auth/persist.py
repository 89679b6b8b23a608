"""What outlives a daemon restart: sessions and the route tokens handed to them (issue 14 item 5).

A host configured once must keep working after the daemon restarts (a reboot, an upgrade), until its
session expires. Two things make that so, kept in two places:

- **the envelope key** — a secret: whoever holds it can sign envelopes. It lives in the credential
  store (``store.credentials``: AES-256-GCM, its own key in the OS keyring or a 0600 key file), as the
  record ``sidecar:sessions / envelope-key / daemon`` (a connector id never has a ``:``). It is read
  only when there are sessions to verify or the first one is made: the keyring library costs the
  daemon memory a daemon without sessions never needs.
- **``<state>/sessions.json``** (0600, written atomically after every change) — the session records
  (id, project, workspace, mode, grant, network, times, owner process) and, per route, the SHA-256 of
  each token handed out with the latest expiry of its sessions. **Never a token**: the file alone
  opens nothing, since a request needs the token itself, which only the hosts hold. It carries a MAC
  under a subkey of the envelope key (``EnvelopeKeys.seal``), so a file changed by anything but the
  daemon (a digest of someone else's token added, an ended session put back) is refused as a whole.

``session end``, ``routes rotate``, untrusting a connector and expiry change the file at once, so a
revocation survives a restart. **A write that fails never costs the file** (issue 21): out of
descriptors (``EMFILE`` opening the temp file), a full disk or an unsafe directory leave the previous
file as it was, and the journal keeps the write pending: it is tried again at the next change, every
few seconds (``keeping_saved``, bounded back-off) and when the daemon stops. Only if the daemon stops
with a revocation still unwritten is the file set aside (renamed ``sessions.json.unsaved``, kept for
the user, never read), so that nothing ended comes back at the next start (fail closed); a pending
write that only adds (a new session) leaves the file in place. While the daemon stops it ends its
sessions and routes in memory, but the journal is closed first (``close``): those ends are the
daemon's, not the user's, and are not written.

A file that is unreadable, corrupt, of another version or not sealed by the daemon, or a key that is
missing or does not match the file, starts the daemon clean — no session from before the restart —
with one log line saying why; it never stops the daemon. Everything here is synchronous: ``load`` and
``signing_keys`` may ask the OS keyring, so callers run them off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar.auth.encoding import b64url_decode, b64url_encode
from sidecar.auth.envelope import KEY_BYTES, EnvelopeKeys
from sidecar.auth.owners import Owner
from sidecar.auth.routes import CarriedToken
from sidecar.auth.sessions import Mode, Session, validate_pattern
from sidecar.canonical import canonical_json
from sidecar.errors import SidecarError, StorageError
from sidecar.store.credentials import CredentialStore, RecordId
from sidecar.store.files import read_json, write_json

__all__ = ["KEY_RECORD", "STATE_VERSION", "Restored", "StateJournal", "keeping_saved"]

logger = logging.getLogger(__name__)

STATE_VERSION: Final = 2
"""2 added the MAC; a file of version 1 (written before it) is refused like any other unsealed file."""
SEAL_PURPOSE: Final = "sessions.json"
KEY_RECORD: Final = RecordId(connector="sidecar:sessions", account="envelope-key", issuer="daemon")
"""The credential-store record of the envelope key (``:`` keeps it apart from every connector's)."""
SET_ASIDE_SUFFIX: Final = ".unsaved"
"""Where the file goes when the daemon stops with a revocation it could not write (never read back)."""
RETRY_FIRST: Final = 1.0
RETRY_LONGEST: Final = 30.0
"""Seconds between tries of a pending write: doubling from the first to the longest."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _OwnerModel(_Model):
    pid: int = Field(gt=1)
    start: int | None

    def owner(self) -> Owner:
        return Owner(self.pid, self.start)


class _SessionModel(_Model):
    id: str = Field(pattern=r"^s_[A-Za-z0-9_-]{22}$")
    project_id: str = Field(max_length=128)
    workspace: str = Field(max_length=4096)
    mode: Literal["default", "read-only", "bypass"]
    allow: list[str] = Field(max_length=256)
    network: bool
    created_at: int = Field(ge=0)
    expires_at: int = Field(ge=0)
    owner: _OwnerModel | None
    agent: _OwnerModel | None
    label: str = Field(default="", max_length=80)

    def session(self) -> Session:
        for pattern in self.allow:
            validate_pattern(pattern)
        return Session(
            id=self.id,
            project_id=self.project_id,
            workspace=self.workspace,
            mode=Mode(self.mode),
            allow=tuple(self.allow),
            network=self.network,
            created_at=self.created_at,
            expires_at=self.expires_at,
            owner=self.owner.owner() if self.owner is not None else None,
            agent=self.agent.owner() if self.agent is not None else None,
            label=self.label,
        )


class _TokenModel(_Model):
    digest: str = Field(pattern=r"^[A-Za-z0-9_-]{43}$")
    until: int = Field(ge=0)


class _StateModel(_Model):
    version: Literal[2]
    kid: str | None = Field(max_length=32)
    mac: str | None = Field(pattern=r"^[A-Za-z0-9_-]{43}$")
    """The envelope key's ``sessions.json`` subkey over the rest of the document (canonical JSON)."""
    sessions: list[_SessionModel] = Field(max_length=100_000)
    tokens: dict[str, list[_TokenModel]]


@dataclass(frozen=True, slots=True)
class Restored:
    """What an earlier run left: live sessions, the keys that verify their envelopes, tokens handed out."""

    sessions: list[Session] = field(default_factory=list)
    keys: EnvelopeKeys | None = None
    tokens: dict[str, list[CarriedToken]] = field(default_factory=dict)


class StateJournal:
    """Keeps ``sessions.json`` equal to the live sessions and tokens, and the envelope key in the store."""

    def __init__(self, path: Path, credentials: CredentialStore, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._credentials = credentials
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: EnvelopeKeys | None = None
        self._kid: str | None = None
        self._sessions: list[Session] = []
        self._tokens: dict[str, list[CarriedToken]] = {}
        self._closed = False
        self._key_unsaved: dict[str, str] | None = None
        """A key minted while the credential store refused it: stored before the next file is written."""
        self._on_disk: dict[str, Any] | None = None
        """The document last written or read (None: no file of ours yet)."""
        self._takes_away = False
        """A pending write ends or narrows something the file on disk still holds."""
        self.unsaved = False
        """A change is not on disk yet: the last write failed and is retried."""

    # -- start ---------------------------------------------------------------------------------------

    def load(self) -> Restored:
        """The live sessions and tokens of the last run; ``Restored()`` (a clean start) when there are
        none, or the file or the key cannot be trusted (said in one log line)."""
        read = self._read_file()
        if read is None:
            return Restored()
        state, data = read
        keys = None
        if state.sessions or state.tokens:
            keys = self._stored_keys(expected_kid=state.kid)
            if keys is None:
                self._start_clean("the envelope key in the credential store is missing, unreadable or not the one")
                return Restored()
            # SECURITY: a file changed by anyone but the daemon (a process of the user's with write access
            # to the state directory) could add a token digest of its own or bring back an ended session.
            if not _sealed_by(keys, state, data):
                self._start_clean("it was changed outside the daemon (its MAC does not match); refused as a whole")
                return Restored()
        now = self._clock()
        try:
            sessions = [s.session() for s in state.sessions if s.expires_at > now]
            tokens = {
                name: kept
                for name, entries in state.tokens.items()
                if (kept := [CarriedToken(b64url_decode(t.digest), t.until) for t in entries if t.until > now])
            }
        except (SidecarError, ValueError) as exc:
            self._start_clean(f"it holds an invalid entry ({exc})")
            return Restored()
        if keys is not None:
            self._keys, self._kid = keys, state.kid
        self._sessions, self._tokens = sessions, tokens
        self._on_disk = data
        logger.info("kept across the restart: %d sessions, tokens of %d routes", len(sessions), len(tokens))
        return Restored(sessions=sessions, keys=keys, tokens=tokens)

    def _read_file(self) -> tuple[_StateModel, dict[str, Any]] | None:
        try:
            data = read_json(self.path)
        except FileNotFoundError:
            return None
        except (StorageError, OSError) as exc:
            self._start_clean(str(exc))
            return None
        try:
            return _StateModel.model_validate(data), data
        except ValidationError as exc:
            self._start_clean(f"it is not a sessions file of version {STATE_VERSION} ({_first_error(exc)})")
            return None

    def _start_clean(self, why: str) -> None:
        logger.warning(
            "%s cannot be used: %s; starting with no sessions from before the restart (hosts need new ones)",
            self.path,
            why,
        )

    # -- the key -------------------------------------------------------------------------------------

    def signing_keys(self) -> EnvelopeKeys:
        """The envelope key: the stored one, or a new one stored now. Should the store fail, the key is
        kept in memory and stored before the file is next written (nothing is written under a key the
        store does not hold, so until then the file keeps what it held)."""
        with self._lock:
            if self._keys is not None:
                return self._keys
            keys = self._stored_keys(expected_kid=None)
            if keys is None:
                kid, key = b64url_encode(secrets.token_bytes(6)), secrets.token_bytes(KEY_BYTES)  # SECURITY: CSPRNG
                keys = EnvelopeKeys([(kid, key)])
                self._key_unsaved = {"kid": kid, "key": base64.b64encode(key).decode("ascii")}
                try:
                    self._store_key()
                except Exception as exc:
                    logger.warning(
                        "cannot store the envelope key yet (%s: %s); tried again before sessions.json is written",
                        type(exc).__name__,
                        exc,
                    )
            self._keys, self._kid = keys, keys.signing_kid
            return keys

    def _store_key(self) -> None:
        if self._key_unsaved is not None:
            # No OAuth grant: nothing revokes this record, so its generation is whatever it is now.
            generation = self._credentials.generation(KEY_RECORD.connector)
            self._credentials.put(KEY_RECORD, self._key_unsaved, generation=generation)
            self._key_unsaved = None

    def _stored_keys(self, *, expected_kid: str | None) -> EnvelopeKeys | None:
        try:
            secret = self._credentials.get(KEY_RECORD)
        except Exception as exc:
            logger.warning("cannot read the envelope key (%s: %s)", type(exc).__name__, exc)
            return None
        if secret is None:
            return None
        kid, encoded = secret.get("kid"), secret.get("key")
        if not isinstance(kid, str) or not isinstance(encoded, str):
            return None
        if expected_kid is not None and kid != expected_kid:
            return None
        try:
            return EnvelopeKeys([(kid, base64.b64decode(encoded.encode("ascii"), validate=True))])
        except (ValueError, binascii.Error, UnicodeEncodeError):  # EnvelopeKeys refuses a short key or a bad kid
            return None

    # -- changes -------------------------------------------------------------------------------------

    def sessions_changed(self, sessions: Iterable[Session]) -> None:
        self._sessions = list(sessions)
        self._write()

    def tokens_changed(self, tokens: Mapping[str, Sequence[CarriedToken]]) -> None:
        self._tokens = {name: list(kept) for name, kept in tokens.items()}
        self._write()

    def flush(self) -> bool:
        """Try a pending write again; True when nothing is pending any more."""
        if self.unsaved and not self._closed:
            self._write()
        return not self.unsaved

    def close(self) -> None:
        """Write nothing more: the daemon is stopping, and what it ends now must be there at the next start.

        A write still pending is tried once more first. Should it fail and take something away that the
        file still holds, the file is set aside (renamed, not deleted) so that it cannot bring it back.
        """
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self.unsaved and self._takes_away:
            self._set_aside()

    def _set_aside(self) -> None:
        aside = self.path.with_name(self.path.name + SET_ASIDE_SUFFIX)
        try:
            os.replace(self.path, aside)  # SECURITY: a rename needs no new descriptor and no disk space
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.error(
                "cannot set %s aside (%s): it still holds what was ended since; remove it before the next start",
                self.path,
                exc,
            )
            return
        logger.error(
            "%s could not record what was ended since it was last written; set aside as %s so that nothing "
            "ended comes back: the next start has no session from before it",
            self.path,
            aside.name,
        )

    def _write(self) -> None:
        if self._closed:
            return
        document: dict[str, Any] | None = None
        try:
            document = self._document()
            self._store_key()  # SECURITY: a file sealed under a key the store does not hold is refused later
            write_json(self.path, document)
        except Exception as exc:  # the store may fail in the keyring's own ways
            if document is not None:
                self._takes_away = self._takes_away or _takes_away(self._on_disk, document, self._clock())
            if not self.unsaved:
                logger.error(
                    "cannot write %s (%s: %s); it keeps its previous contents, and the write is retried",
                    self.path,
                    type(exc).__name__,
                    exc,
                )
            self.unsaved = True
            return
        if self.unsaved:
            logger.info("%s is written again", self.path)
        self._on_disk, self._takes_away, self.unsaved = document, False, False

    def _document(self) -> dict[str, Any]:
        now = self._clock()
        sessions = [_session_entry(s) for s in self._sessions if not s.expired(now)]
        tokens = {
            name: [{"digest": b64url_encode(t.digest), "until": t.until} for t in kept if t.until > now]
            for name, kept in sorted(self._tokens.items())
        }
        keys = self._keys
        if keys is None and (sessions or tokens):
            keys = self.signing_keys()  # what is handed out needs the key anyway; sets self._kid
        document: dict[str, Any] = {"version": STATE_VERSION, "kid": self._kid, "sessions": sessions, "tokens": tokens}
        document["mac"] = b64url_encode(keys.seal(SEAL_PURPOSE, _sealed_bytes(document))) if keys is not None else None
        return document


@contextlib.asynccontextmanager
async def keeping_saved(journal: StateJournal) -> AsyncIterator[None]:
    """While inside: a write the journal could not make is tried again, with bounded back-off."""

    async def retry() -> None:
        delay = RETRY_FIRST
        while True:
            await asyncio.sleep(delay)
            if journal.unsaved:
                delay = RETRY_FIRST if journal.flush() else min(delay * 2, RETRY_LONGEST)

    task = asyncio.create_task(retry(), name="sessions-journal-retry")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _takes_away(before: Mapping[str, Any] | None, after: Mapping[str, Any], now: float) -> bool:
    """Whether ``after`` ends or changes a live session, or drops a live token digest, of ``before``."""
    if before is None:
        return False
    sessions_after = {entry["id"]: entry for entry in after.get("sessions", [])}
    for entry in before.get("sessions", []):
        if (
            isinstance(entry, dict)
            and entry.get("expires_at", 0) > now
            and sessions_after.get(entry.get("id")) != entry
        ):
            return True
    tokens_after = after.get("tokens", {})
    for name, kept in (before.get("tokens") or {}).items():
        digests = {t["digest"] for t in tokens_after.get(name, [])}
        if any(isinstance(t, dict) and t.get("until", 0) > now and t.get("digest") not in digests for t in kept):
            return True
    return False


def _sealed_bytes(document: Mapping[str, Any]) -> bytes:
    """What the MAC covers: the whole document but its ``mac``, as canonical JSON."""
    return canonical_json({key: value for key, value in document.items() if key != "mac"})


def _sealed_by(keys: EnvelopeKeys, state: _StateModel, data: Mapping[str, Any]) -> bool:
    if state.mac is None or state.kid is None:
        return False
    try:
        mac = b64url_decode(state.mac)
    except ValueError:
        return False
    return keys.unsealed(SEAL_PURPOSE, _sealed_bytes(data), mac, kid=state.kid)


def _owner_entry(owner: Owner | None) -> dict[str, Any] | None:
    return {"pid": owner.pid, "start": owner.start} if owner is not None else None


def _session_entry(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "project_id": session.project_id,
        "workspace": session.workspace,
        "mode": session.mode.value,
        "allow": list(session.allow),
        "network": session.network,
        "created_at": session.created_at,
        "expires_at": session.expires_at,
        "owner": _owner_entry(session.owner),
        "agent": _owner_entry(session.agent),
        "label": session.label,
    }


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "the whole file"
    return f"{where}: {error['msg']}; {exc.error_count()} problems in all"
