"""The credential store: connectors' long-lived secrets, encrypted at rest in ``<data>/credentials.enc``.

One JSON line per record: the connector, account and issuer it belongs to in the clear (they are not
secrets, and ``sidecar status`` may name them), and the secret itself (a JSON object: tokens, expiry,
a client secret) sealed with AES-256-GCM:

- a fresh random 96-bit nonce for every record written (``AESGCM``: never reuse a nonce with a key);
- associated data binding the format version, connector, account and issuer, so a record copied or
  moved to another connector, account or issuer does not decrypt (``InvalidTag``).

**The key** (32 random bytes) lives in the OS keyring through ``keyring`` (Secret Service, KWallet,
macOS Keychain), under an entry named for this home. Where there is no keyring (``NoKeyringError``: a
headless Linux box) it lives in ``<data>/credentials.key``, 0600 beside the store, and ``describe()``
says so: the file protects against other users and against copying the store alone, not against a
process running as the user, who can read both.

**Failure is per record.** A line that is not JSON, a record that does not decrypt (tampered, moved,
truncated), or a secret that is not a JSON object is skipped and reported for its connector
(``unreadable``): that connector needs a new sign-in, every other one keeps working, and the daemon
never fails for it. Writes rewrite the whole file atomically (``store.files.write_atomic``), so a crash
leaves the old store or the new one. Nothing here logs a secret; messages name connectors only.

**A revoke wins** (issue 24). Each connector has a grant *generation*, owned here: ``revoke_connector``
bumps it and deletes the connector's records under the store's lock, and every ``put`` names the
generation its work started from (``generation``, ``snapshot``) and is refused with ``StaleGrant``
under that same lock when it is older. So a refresh or a sign-in in flight when the grant is revoked
either wrote before the revoke (its record is among those the revoke deleted and returned, to be
revoked remotely) or is refused: never stored after it. Generations live in memory: a restart has
nothing in flight, and the file is what it reads.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sidecar.errors import StaleGrant, StorageError
from sidecar.store.files import loads_strict, read_private, write_atomic

__all__ = [
    "FORMAT_VERSION",
    "CredentialStore",
    "DeferredKey",
    "FileKey",
    "KeySource",
    "KeyringKey",
    "RecordId",
    "choose_key_source",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION: Final = 1
KEY_BYTES: Final = 32  # AES-256
NONCE_BYTES: Final = 12  # 96 bits, as NIST recommends for GCM
KEYRING_SERVICE: Final = "sidecar"
_MAX_STORE_BYTES: Final = 8 * 1024 * 1024


class KeySource(Protocol):
    """Where the store's key is kept; ``load`` creates it on first use."""

    def load(self) -> bytes: ...

    def describe(self) -> str: ...

    @property
    def insecure(self) -> bool:
        """True when the key sits in a file rather than an OS keyring."""
        ...


class KeyringKey:
    """The key in the OS keyring (``keyring``), base64url under (``sidecar``, ``entry``)."""

    insecure = False

    def __init__(self, entry: str) -> None:
        self._entry = entry

    def load(self) -> bytes:
        import keyring  # deferred: choosing a backend costs a tenth of a second at import

        stored = keyring.get_password(KEYRING_SERVICE, self._entry)
        if stored is not None:
            return _decode_key(stored, f"the OS keyring entry {KEYRING_SERVICE}/{self._entry}")
        key = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        keyring.set_password(KEYRING_SERVICE, self._entry, base64.urlsafe_b64encode(key).decode("ascii"))
        return key

    def describe(self) -> str:
        return "credential key in the OS keyring"


class FileKey:
    """The key in a 0600 file of ours, for machines without an OS keyring."""

    insecure = True

    def __init__(self, path: Path) -> None:
        self._path = path

    def load(self) -> bytes:
        try:
            raw = read_private(self._path, max_bytes=1024)
        except FileNotFoundError:
            key = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
            write_atomic(self._path, base64.urlsafe_b64encode(key) + b"\n")
            return key
        # SECURITY: read_private refuses what others may write; a key must not be readable by them either.
        if os.stat(self._path, follow_symlinks=False).st_mode & 0o077:
            raise StorageError(f"{self._path} may be read by other users; make it 0600 (the key may be known)")
        return _decode_key(raw.decode("ascii", "replace").strip(), str(self._path))

    def describe(self) -> str:
        return f"credential key in a file (no OS keyring): {self._path}"


class DeferredKey:
    """A key source chosen on first use (``load``, called off the event loop by the store's users).

    Choosing asks the OS keyring, and importing ``keyring`` with its backends costs the daemon about
    5 MB of memory for its whole life: a daemon that never stores a credential never pays it.
    """

    def __init__(self, entry: str, key_file: Path) -> None:
        self._entry = entry
        self._key_file = key_file
        self._chosen: KeySource | None = None
        self._lock = threading.Lock()

    def load(self) -> bytes:
        with self._lock:
            if self._chosen is None:
                self._chosen = choose_key_source(self._entry, self._key_file)
        return self._chosen.load()

    def describe(self) -> str:
        if self._chosen is not None:
            return self._chosen.describe()
        if self._key_file.exists():
            return FileKey(self._key_file).describe()
        return "no credential key yet (none stored or read since the daemon started)"

    @property
    def insecure(self) -> bool:
        return self._chosen.insecure if self._chosen is not None else self._key_file.exists()


def choose_key_source(entry: str, key_file: Path) -> KeySource:
    """The OS keyring when one works here, else the key file (and say why once)."""
    try:
        import keyring
        from keyring.errors import KeyringError

        keyring.get_password(KEYRING_SERVICE, entry)
    except KeyringError as exc:  # NoKeyringError on a headless box; a locked keyring the user dismissed
        logger.warning("no usable OS keyring (%s); the credential key goes in %s", type(exc).__name__, key_file)
        return FileKey(key_file)
    return KeyringKey(entry)


def _decode_key(text: str, where: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError):
        key = b""
    if len(key) != KEY_BYTES:
        raise StorageError(f"{where} does not hold a {KEY_BYTES}-byte key; credentials cannot be read")
    return key


@dataclass(frozen=True, slots=True)
class RecordId:
    """Whose secret a record is: a connector's, for one account at one issuer."""

    connector: str
    account: str
    issuer: str

    def associated_data(self) -> bytes:
        # Length-prefixed fields: no choice of names can make two different ids encode alike.
        parts = (str(FORMAT_VERSION), self.connector, self.account, self.issuer)
        return b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in parts)


class CredentialStore:
    """Encrypted records in one file; every method is synchronous and thread-safe (call it off the loop)."""

    def __init__(self, path: Path, key: KeySource) -> None:
        self.path = path
        self._key_source = key
        self._key: bytes | None = None
        self._lock = threading.Lock()
        self.unreadable: set[str] = set()
        """Connectors with a record that would not decrypt at the last read: they need a new sign-in."""
        self._generations: dict[str, int] = {}

    def describe(self) -> str:
        return self._key_source.describe()

    @property
    def insecure(self) -> bool:
        return self._key_source.insecure

    # -- reading -----------------------------------------------------------------------------------

    def get(self, record: RecordId) -> dict[str, Any] | None:
        """The secret of ``record``; None when there is none or it cannot be read (``unreadable``)."""
        with self._lock:
            return self._read().get(record)

    def records(self, connector: str) -> list[RecordId]:
        """The records a connector has that decrypt."""
        return list(self.secrets(connector))

    def secrets(self, connector: str) -> dict[RecordId, dict[str, Any]]:
        """Every record of a connector that decrypts, with its secret: one read of the file."""
        return self.snapshot(connector)[1]

    def snapshot(self, connector: str) -> tuple[int, dict[RecordId, dict[str, Any]]]:
        """The connector's generation and every record of it that decrypts, read together: a write
        based on these records passes that generation."""
        with self._lock:
            found = {record: secret for record, secret in self._read().items() if record.connector == connector}
            return self.generation(connector), found

    def generation(self, connector: str) -> int:
        """The connector's grant generation: 0 at start, one more after each ``revoke_connector``.
        Reading it needs no lock (one dict lookup); ``put`` checks it under the lock."""
        return self._generations.get(connector, 0)

    # -- writing -----------------------------------------------------------------------------------

    def put(self, record: RecordId, secret: Mapping[str, Any], *, generation: int) -> None:
        """Store (or replace) the secret of ``record``, under a fresh nonce. ``generation``: the
        connector's generation the write's work started from; ``StaleGrant`` when it was revoked since."""
        with self._lock:
            # SECURITY: checked under the lock revoke_connector bumps under: nothing revoked is stored again.
            if generation != self.generation(record.connector):
                raise StaleGrant(f"the grant of {record.connector} was revoked while this write was under way")
            current = self._read()
            current[record] = dict(secret)
            self._write(current)
            self.unreadable.discard(record.connector)

    def delete(self, record: RecordId) -> bool:
        with self._lock:
            current = self._read()
            found = current.pop(record, None) is not None
            if found:
                self._write(current)
            return found

    def revoke_connector(self, connector: str) -> tuple[int, list[dict[str, Any]]]:
        """Bump the connector's generation and remove every record of it, readable or not, in one step.
        Returns how many records went and the secrets of those that decrypted (what the caller must
        revoke remotely). A write begun before this returns is refused from now on (``put``)."""
        with self._lock:
            self._generations[connector] = self.generation(connector) + 1
            secrets = [secret for record, secret in self._read().items() if record.connector == connector]
            lines = list(self._lines())
            kept = [line for line in lines if _connector_of(line) != connector]
            if len(kept) != len(lines):
                write_atomic(self.path, b"".join(kept))
            self.unreadable.discard(connector)
            return len(lines) - len(kept), secrets

    # -- the file ----------------------------------------------------------------------------------

    def _lines(self) -> Iterator[bytes]:
        try:
            raw = read_private(self.path, max_bytes=_MAX_STORE_BYTES)
        except FileNotFoundError:
            return
        for line in raw.splitlines(keepends=True):
            if line.strip():
                yield line if line.endswith(b"\n") else line + b"\n"

    def _read(self) -> dict[RecordId, dict[str, Any]]:
        found: dict[RecordId, dict[str, Any]] = {}
        unreadable: set[str] = set()
        for number, line in enumerate(self._lines(), start=1):
            opened = self._open(line)
            if isinstance(opened, str):
                unreadable.add(opened)
                logger.warning(
                    "credential record %d of %s is unreadable; %s must sign in again", number, self.path, opened
                )
                continue
            if opened is None:
                logger.warning(
                    "credential record %d of %s is damaged and names no connector; skipped", number, self.path
                )
                continue
            found[opened[0]] = opened[1]
        self.unreadable = unreadable
        return found

    def _open(self, line: bytes) -> tuple[RecordId, dict[str, Any]] | str | None:
        """(id, secret); or the connector's name when its record does not open; None when not even that."""
        try:
            data = loads_strict(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("connector"), str):
            return None
        connector = str(data["connector"])
        try:
            if data.get("v") != FORMAT_VERSION:
                return connector
            record = RecordId(connector, str(data["account"]), str(data["issuer"]))
            nonce = base64.urlsafe_b64decode(str(data["nonce"]))
            sealed = base64.urlsafe_b64decode(str(data["data"]))
            plain = AESGCM(self._key_bytes()).decrypt(nonce, sealed, record.associated_data())
            secret = loads_strict(plain)
        except (KeyError, ValueError, binascii.Error, InvalidTag):
            return connector
        return (record, secret) if isinstance(secret, dict) else connector

    def _write(self, records: Mapping[RecordId, Mapping[str, Any]]) -> None:
        aead = AESGCM(self._key_bytes())
        lines = []
        for record, secret in sorted(records.items(), key=lambda item: (item[0].connector, item[0].account)):
            nonce = os.urandom(NONCE_BYTES)
            plain = json.dumps(secret, separators=(",", ":"), allow_nan=False).encode()
            sealed = aead.encrypt(nonce, plain, record.associated_data())
            entry = {
                "v": FORMAT_VERSION,
                "connector": record.connector,
                "account": record.account,
                "issuer": record.issuer,
                "nonce": base64.urlsafe_b64encode(nonce).decode("ascii"),
                "data": base64.urlsafe_b64encode(sealed).decode("ascii"),
            }
            lines.append(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        # A record that would not open is kept as it is (evidence, and the user's to delete) until its
        # connector gets a readable record again: a new sign-in replaces it.
        written = {record.connector for record in records}
        kept = [line for line in self._lines() if _unopened(self._open(line), written)]
        write_atomic(self.path, b"".join(lines + kept))

    def _key_bytes(self) -> bytes:
        if self._key is None:
            self._key = self._key_source.load()
        return self._key


def _unopened(opened: tuple[RecordId, dict[str, Any]] | str | None, written: set[str]) -> bool:
    return opened is None or (isinstance(opened, str) and opened not in written)


def _connector_of(line: bytes) -> str | None:
    try:
        data = loads_strict(line)
    except ValueError:
        return None
    return data.get("connector") if isinstance(data, dict) and isinstance(data.get("connector"), str) else None
