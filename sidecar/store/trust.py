"""The trust store: which connectors the user trusted, at ``<state>/approvals.json`` (contract §5).

A connector is trusted under the key ``<name>::<sha256 hex of its canonical launch config>``; any change
to the launch config changes the key, so the old approval no longer applies. With each key the store
keeps the tool fingerprints the user approved (``tool_fingerprint``), so a server that later rewrites a
tool's description or schema shows up as drift (``tool_drift``) instead of slipping in silently.

File (0600, written only through ``sidecar.store.files``)::

    {"version": 1,
     "connectors": {"<name>::<64 hex>": {"name": "<name>", "trusted_at": "<RFC 3339>",
                                         "tools": {"<tool>": "<64 hex>"}}}}

The security properties, each with a test:

- **A read failure never widens trust.** A file that is not valid JSON, does not match the schema
  (unknown fields, a key whose name part is not ``name``, duplicate JSON keys, NaN), is a symlink,
  belongs to another user or may be written by group/others is *refused*: the last good snapshot stays
  in force (on a fresh start: nothing trusted), ``problem`` says why, and ``trust.store_refused`` is
  emitted and logged at WARNING once per distinct problem. A missing file is an empty store.
- **The whole path is checked, not only the file** (issue 11 item 4). A directory between the file and
  ``root`` (the state directory) that is a symlink, someone else's, or writable by group/others, a
  directory above it (the home, ``/``) that another user owns or may write without the sticky bit, or the
  same of a ``guarded`` root (the config directory, whose launch configs trust is pinned to) is as unsafe
  as a loose file: whoever may rename entries there may put an older approvals.json, or a stale temp file,
  in place of ours. It is refused like one, and nothing is written there.
- **A refused file is evidence.** While the file on disk is refused, every write raises
  ``StorageError`` ("fix or remove <path> first") rather than replace it; ``reload()`` picks up the fix.
- **Writes are validate → commit → roll back.** Each write re-reads the file first (so a hand edit
  made since the last load is neither lost nor silently overwritten, and tampering is noticed), builds
  the new document in memory, parses it back with the reader's own rules, ``write_atomic``-s it, reads
  the file again and compares bytes. If any step fails the in-memory snapshot stays the one last read
  from disk, the previous file content is put back if it had been replaced, and the method raises
  ``StorageError``.
- **Crash safety** comes from ``write_atomic`` (temp file + fsync + rename + directory fsync): a killed
  process leaves the old file or the new one. The temp files it may leave behind are never read; those
  of dead processes are removed when a store is opened.

Concurrency: every method is synchronous and holds a lock, so calls from one event loop (or threads, via
``asyncio.to_thread``) never interleave. One process should write the file (the daemon); a second
writer is tolerated (each write re-reads first) but not locked against.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from sidecar.canonical import canonical_json, utc_timestamp
from sidecar.errors import NotFound, StorageError
from sidecar.store.files import check_directory_chain, loads_strict, read_private, remove_quietly, write_atomic
from sidecar.system import pid_alive
from sidecar.text import preview

__all__ = [
    "EVENT_GRANTED",
    "EVENT_REVOKED",
    "EVENT_STORE_REFUSED",
    "EVENT_TOOLS_APPROVED",
    "TrustRecord",
    "TrustStore",
    "tool_fingerprint",
]

logger = logging.getLogger(__name__)

EVENT_GRANTED: Final = "trust.granted"
EVENT_REVOKED: Final = "trust.revoked"
EVENT_TOOLS_APPROVED: Final = "trust.tools_approved"
EVENT_STORE_REFUSED: Final = "trust.store_refused"

_VERSION: Final = 1
_MAX_BYTES: Final = 4 * 1024 * 1024  # a trust store of this size is damage, not approvals
_MAX_NAME: Final = 256  # characters in a connector or tool name
_KEY: Final = re.compile(r"(?P<name>.+)::(?P<digest>[0-9a-f]{64})")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")
_FINGERPRINT_FIELDS: Final = ("name", "description", "inputSchema", "annotations")

EventSink = Callable[[str, dict[str, object]], None]


@dataclass(frozen=True, slots=True)
class TrustRecord:
    """One trusted connector key, as the file holds it (``tools`` is read-only)."""

    key: str
    """``<name>::<sha256 hex of the launch config>``."""
    name: str
    trusted_at: str
    """When the user trusted this key, RFC 3339 UTC."""
    tools: Mapping[str, str]
    """Tool name → approved fingerprint (``tool_fingerprint``); empty until the first listing."""


def tool_fingerprint(tool: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of a tool's name, description, inputSchema and annotations.

    A missing field counts as ``null``; key order does not matter. Other fields do not change it.
    """
    subset = {field: tool.get(field) for field in _FINGERPRINT_FIELDS}
    return hashlib.sha256(canonical_json(subset)).hexdigest()


# --- the file format -----------------------------------------------------------------------------------


def _check_name(value: str) -> str:
    # SECURITY: names reach logs, `sidecar status` and the audit log: no control characters, no lone
    # surrogates (json.loads accepts "\ud800"; encoding it later would raise).
    if not value or len(value) > _MAX_NAME:
        raise ValueError(f"must be 1 to {_MAX_NAME} characters")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in value):
        raise ValueError("must not contain control characters or lone surrogates")
    return value


def _check_fingerprint(value: str) -> str:
    if not _HEX64.fullmatch(value):
        raise ValueError("must be 64 lowercase hex digits")
    return value


def _check_timestamp(value: str) -> str:
    if not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 timestamp")
    datetime.fromisoformat(value)  # ValueError for 2025-13-40
    return value


def _exact_int(value: object) -> object:
    if type(value) is not int:  # Literal[1] would take True and 1.0
        raise ValueError("must be the integer 1")
    return value


_Name = Annotated[str, AfterValidator(_check_name)]
_Fingerprint = Annotated[str, AfterValidator(_check_fingerprint)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: _Name
    trusted_at: Annotated[str, AfterValidator(_check_timestamp)]
    tools: dict[_Name, _Fingerprint]


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Annotated[Literal[1], BeforeValidator(_exact_int)]
    connectors: dict[str, _Entry]

    @model_validator(mode="after")
    def _keys_match_names(self) -> _Document:
        for key, entry in self.connectors.items():
            match = _KEY.fullmatch(key)
            if match is None:
                raise ValueError(f"key {preview(key, 80)} is not '<name>::<64 hex>'")
            if match["name"] != entry.name:
                raise ValueError(f"key {preview(key, 80)} does not belong to name {preview(entry.name, 80)}")
        return self


def _parse(raw: bytes, path: Path) -> dict[str, TrustRecord]:
    """Strict JSON + schema → records; ``StorageError`` naming the file and the first problem."""
    try:
        value = loads_strict(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise StorageError(f"{path}: not valid JSON ({exc})") from exc
    try:
        document = _Document.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "document"
        raise StorageError(f"{path}: not a valid trust store ({where}: {first['msg']})") from exc
    return {
        key: TrustRecord(
            key=key, name=entry.name, trusted_at=entry.trusted_at, tools=MappingProxyType(dict(entry.tools))
        )
        for key, entry in document.connectors.items()
    }


def _serialize(records: Mapping[str, TrustRecord]) -> bytes:
    document = {
        "version": _VERSION,
        "connectors": {
            key: {"name": r.name, "trusted_at": r.trusted_at, "tools": dict(r.tools)} for key, r in records.items()
        },
    }
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


# --- the store -----------------------------------------------------------------------------------------


class _UnsafePath(StorageError):
    """A directory on the store's path is unsafe (not the file itself): the remedy is the directory's."""


class TrustStore:
    """The trust store at ``path``. Loads on construction and never raises there for a bad file."""

    def __init__(
        self,
        path: Path,
        *,
        on_event: EventSink | None = None,
        root: Path | None = None,
        guarded: Sequence[Path] = (),
    ) -> None:
        """``root``: the top of sidecar's own directories above ``path`` (default: its directory); every
        directory from the file up to it must be private, and every one above it safe
        (``check_directory_chain``). ``guarded``: other roots trust depends on, checked the same way."""
        self._path = path
        self._on_event = on_event
        self._root = root if root is not None else path.parent
        self._guarded = tuple(guarded)
        self._lock = threading.RLock()
        self._records: dict[str, TrustRecord] = {}
        self._problem: str | None = None
        self._reported: set[str] = set()
        self.reload()
        if self._problem is None:  # never touch a directory that is refused
            self._sweep_temp_files()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def problem(self) -> str | None:
        """Why the file on disk is not in force (for ``sidecar status``), or ``None``."""
        return self._problem

    def is_trusted(self, key: str) -> bool:
        return key in self._records

    def record(self, key: str) -> TrustRecord | None:
        return self._records.get(key)

    def records_named(self, name: str) -> list[TrustRecord]:
        """The keys trusted under one connector name (what it was trusted as, whatever it is now)."""
        return [r for r in self._records.values() if r.name == name]

    def names(self) -> list[str]:
        """Every trusted connector name, sorted."""
        return sorted({r.name for r in self._records.values()})

    def reload(self) -> bool:
        """Re-read the file; return whether the in-memory snapshot changed. A refused file changes nothing."""
        with self._lock:
            try:
                changed, _ = self._refresh()
            except StorageError:
                return False
            return changed

    def recheck(self) -> str | None:
        """Re-read the store now (``reload``) and return why it is refused, or None: ``sidecar status``
        asks this, so a directory loosened while the daemon runs shows (and is audited) without a write."""
        self.reload()
        return self._problem

    def trust(self, key: str, *, name: str, facts: Mapping[str, object] | None = None) -> TrustRecord:
        """Trust ``key`` for ``name``; drop any other key of that name (its config changed). Idempotent.
        ``facts`` go into the audit record (how the connector will run: its sandbox)."""
        with self._lock:
            previous = self._begin_write()
            base = self._records
            existing = base.get(key)
            replaced = sorted(k for k, r in base.items() if r.name == name and k != key)
            if existing is not None and existing.name == name and not replaced:
                return existing
            record = TrustRecord(key=key, name=name, trusted_at=utc_timestamp(), tools=MappingProxyType({}))
            records = {k: r for k, r in base.items() if k not in replaced}
            records[key] = record
            self._commit(records, previous)
            logger.info("trusted %s (%s)%s", name, key, f", replacing {', '.join(replaced)}" if replaced else "")
            self._emit(EVENT_GRANTED, {"name": name, "key": key, "replaced": replaced, **(facts or {})})
            return record

    def untrust(self, name: str) -> list[str]:
        """Remove every key of ``name``; return the removed keys (empty: nothing was trusted)."""
        with self._lock:
            previous = self._begin_write()
            removed = sorted(k for k, r in self._records.items() if r.name == name)
            if not removed:
                return []
            self._commit({k: r for k, r in self._records.items() if k not in removed}, previous)
            for key in removed:
                logger.info("untrusted %s (%s)", name, key)
                self._emit(EVENT_REVOKED, {"name": name, "key": key})
            return removed

    def approve_tools(self, key: str, fingerprints: Mapping[str, str]) -> TrustRecord:
        """Record ``fingerprints`` as the approved tools of ``key`` (replacing any before); ``NotFound`` if
        the key is not trusted."""
        with self._lock:
            previous = self._begin_write()
            current = self._records.get(key)
            if current is None:
                raise NotFound("this connector configuration is not trusted")
            tools = MappingProxyType(dict(sorted(fingerprints.items())))
            if current.tools == tools:
                return current
            record = TrustRecord(key=key, name=current.name, trusted_at=current.trusted_at, tools=tools)
            self._commit({**self._records, key: record}, previous)
            logger.info("approved %d tool(s) of %s (%s)", len(tools), current.name, key)
            self._emit(EVENT_TOOLS_APPROVED, {"name": current.name, "key": key, "tools": sorted(tools)})
            return record

    def tool_drift(self, key: str, current: Mapping[str, str]) -> dict[str, str]:
        """Tool → ``"changed"`` | ``"new"`` for tools of ``current`` whose fingerprint is not the approved
        one. Removed tools are not drift. Empty while no fingerprints are approved (or the key is unknown)."""
        record = self._records.get(key)
        if record is None or not record.tools:
            return {}
        drift: dict[str, str] = {}
        for tool, fingerprint in sorted(current.items()):
            approved = record.tools.get(tool)
            if approved is None:
                drift[tool] = "new"
            elif approved != fingerprint:
                drift[tool] = "changed"
        return drift

    # --- reading ---------------------------------------------------------------------------------------

    def _read(self) -> tuple[bytes | None, dict[str, TrustRecord]]:
        """The file's bytes and records; ``(None, {})`` when missing; ``StorageError`` when refused."""
        # SECURITY: the directories first: a file is only as safe as the path that leads to it.
        try:
            check_directory_chain(self._path.parent, root=self._root)
            for other in self._guarded:
                check_directory_chain(other, root=other)
        except OSError as exc:
            raise StorageError(f"cannot check the directories above {self._path} ({exc.strerror or exc})") from exc
        except StorageError as exc:
            raise _UnsafePath(f"{exc}; no trust is taken from {self._path} until it is fixed") from exc
        try:
            raw = read_private(self._path, max_bytes=_MAX_BYTES)
        except FileNotFoundError:
            return None, {}
        except StorageError as exc:
            if self._path.is_symlink():  # O_NOFOLLOW reports ELOOP; say it plainly
                raise StorageError(f"{self._path} is a symbolic link") from exc
            raise
        except OSError as exc:
            raise StorageError(f"{self._path}: cannot read ({exc.strerror or exc})") from exc
        return raw, _parse(raw, self._path)

    def _refresh(self) -> tuple[bool, bytes | None]:
        """Adopt the file if it is acceptable; else record the problem and raise ``StorageError``."""
        try:
            raw, records = self._read()
        except StorageError as exc:
            self._refuse(str(exc))
            raise
        if self._problem is not None:
            logger.info("trust store %s is in force again", self._path)
        self._problem = None
        self._reported.clear()
        changed = records != self._records
        self._records = records
        return changed, raw

    def _refuse(self, problem: str) -> None:
        # SECURITY: keep the last good snapshot; a bad file never adds (or removes) trust.
        self._problem = problem
        if problem in self._reported:
            return
        self._reported.add(problem)
        logger.warning(
            "trust store refused: %s; the last good snapshot (%d key(s)) stays in force and nothing is written"
            " until the file is fixed or removed",
            problem,
            len(self._records),
        )
        self._emit(EVENT_STORE_REFUSED, {"path": str(self._path), "problem": problem})

    # --- writing ---------------------------------------------------------------------------------------

    def _begin_write(self) -> bytes | None:
        """Re-read the file before changing it; refuse to write over a refused file. Returns its bytes."""
        try:
            _, raw = self._refresh()
        except _UnsafePath as exc:
            # SECURITY: nothing goes into a directory others may change.
            raise StorageError(f"{exc}; nothing is written there meanwhile") from exc
        except StorageError as exc:
            # SECURITY: never overwrite evidence of tampering (or a user's half-finished edit).
            raise StorageError(f"{exc}; fix or remove {self._path} first") from exc
        return raw

    def _commit(self, records: dict[str, TrustRecord], previous: bytes | None) -> None:
        """Validate → write → read back → adopt; on failure restore ``previous`` and raise ``StorageError``."""
        data = _serialize(records)
        try:
            valid = _parse(data, self._path) == records
        except StorageError as exc:
            raise StorageError(f"refused to write {self._path}: {exc}") from exc
        if not valid:
            raise StorageError(f"refused to write {self._path}: the document does not read back as built")
        try:
            write_atomic(self._path, data)
            if read_private(self._path, max_bytes=_MAX_BYTES) != data:
                raise StorageError(f"{self._path} does not read back as written")
        except (OSError, StorageError) as exc:
            self._restore(previous, data)
            raise StorageError(f"could not write {self._path} ({exc}); the previous trust stays in force") from exc
        self._records = records

    def _restore(self, previous: bytes | None, attempted: bytes) -> None:
        """Put ``previous`` back if the file is no longer it (``None``: there was no file)."""
        try:
            current: bytes | None = read_private(self._path, max_bytes=_MAX_BYTES)
        except FileNotFoundError:
            current = None
        except (OSError, StorageError):
            current = attempted  # unknown state: restore the last known good content
        if current == previous:
            return
        try:
            if previous is None:
                remove_quietly(self._path)
            else:
                write_atomic(self._path, previous)
        except (OSError, StorageError) as exc:
            logger.error("could not restore %s after a failed write (%s); check it and run reload", self._path, exc)
        else:
            logger.warning("restored the previous %s after a failed write", self._path)

    def _sweep_temp_files(self) -> None:
        """Remove temp files that dead writers left beside the store (they are never read as the store)."""
        pattern = re.compile(rf"\.{re.escape(self._path.name)}\.(\d+)\.[0-9a-f]{{12}}\.tmp")
        try:
            entries = list(os.scandir(self._path.parent))
        except OSError:
            return
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            if match is None or int(match[1]) == os.getpid() or pid_alive(int(match[1])):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
                    remove_quietly(Path(entry.path))
                    logger.info("removed %s, left by a writer that died (pid %s)", entry.name, match[1])
            except OSError as exc:
                logger.debug("could not remove %s: %s", entry.path, exc)

    def _emit(self, event: str, fields: dict[str, object]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event, fields)
        except Exception:
            # The change is already on disk; a failing observer must not make it look like it failed.
            logger.exception("trust store event handler failed for %s", event)
