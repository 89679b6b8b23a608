"""The audit log: append-only, hash-chained JSON lines at ``<state>/audit.jsonl`` (contract §9).

One record per line, canonical JSON (sorted keys, no spaces, ASCII)::

    {"event":"tool.call","hash":"…","prev":"…","seq":7,"ts":"2025-01-02T03:04:05.678Z", …fields}

- ``seq`` counts from 1, one per record.
- ``prev`` is the SHA-256 of the previous record's line (without its newline); the first record has 64
  zeros. Deleting, inserting or reordering a record breaks the chain at the line after it.
- ``hash`` is the SHA-256 of the canonical JSON of the record without ``hash``: editing a record in place
  breaks it.
- The head file ``<state>/audit.head`` (written atomically) holds ``{"seq","hash"}`` of the last record it
  saw, so cutting records off the *end* of the log — which leaves a valid chain — is detected too.

Trade-off: the head is an atomic file write with two fsyncs (far dearer than an append, which has
none), so it is written on the first append after opening, then at most once per
``head_interval`` seconds (or every ``head_every`` records), and on ``close()``. Tail truncation is
detected back to the last flushed head: at most about a second of records can be cut off unnoticed.
``head_every=1`` closes that gap at the cost of one atomic write per record.

This is tamper-*evident* against edits that do not rewrite the whole chain and the head: someone who can
write the user's files can recompute everything. It guards against accidents, partial tampering and
after-the-fact edits by tools that do not know the format — not against the user's own account.

When a log is reopened and its tail disagrees with the head (truncated, torn last line, head missing),
the log records that in an ``audit.recovered`` record before anything else, so the evidence survives the
next head flush; the verifier (``sidecar.store.auditverify``, ``sidecar audit --verify``) reports such
records as problems. It reads the log with this module's format functions (``parse_record``,
``read_head``, ``record_hash``, ``line_hash``), so writer and verifier cannot disagree on the format.

Callers must never pass secrets: record argument *shapes* (``sidecar.bus.shapes.shape_of``), not values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sidecar.canonical import canonical_json, utc_timestamp
from sidecar.errors import StorageError
from sidecar.store.files import append_line, loads_strict, open_append, open_private, read_private, write_atomic

__all__ = [
    "GENESIS",
    "HASH_FORM",
    "RECOVERED_EVENT",
    "RESERVED_KEYS",
    "AuditLog",
    "line_hash",
    "parse_record",
    "read_head",
    "record_hash",
]

logger = logging.getLogger(__name__)

RESERVED_KEYS: Final = frozenset({"seq", "ts", "event", "prev", "hash"})
RECOVERED_EVENT: Final = "audit.recovered"
GENESIS: Final = "0" * 64
"""The ``prev`` of the first record."""
_HEAD_EVERY: Final = 4096  # most records between head flushes, whatever the time
_HEAD_INTERVAL: Final = 1.0  # seconds between head flushes under load; one flush costs two fsyncs
_TAIL_BLOCK: Final = 8192  # bytes read per step when seeking the last line from the end
_MAX_LINE: Final = 1024 * 1024  # a longer "last line" is damage, not a record
HASH_FORM: Final = re.compile(r"[0-9a-f]{64}")
"""What a record's ``hash`` looks like (lowercase SHA-256 hex; use ``fullmatch``)."""


def _seal(record: dict[str, object]) -> tuple[str, bytes]:
    """``(hash, line)`` for a record without ``hash``, from one canonical encoding.

    With sorted keys, ``hash`` sits between the keys below it and those above it, so the record is
    encoded as those two halves once, and both the hashed text (no ``hash``) and the line (with it) are
    assembled from them: the same bytes as two whole encodings, for less work per record
    (``scripts/bench_ab.py --instructions`` measures it).
    """
    below = canonical_json({k: v for k, v in record.items() if k < "hash"})[1:-1]  # members, no braces
    above = canonical_json({k: v for k, v in record.items() if k > "hash"})[1:-1]
    digest = line_hash(b"{" + b",".join(filter(None, (below, above))) + b"}")
    line = b"{" + b",".join(filter(None, (below, b'"hash":"%s"' % digest.encode("ascii"), above))) + b"}"
    return digest, line


def line_hash(data: bytes) -> str:
    """SHA-256 hex of a line without its newline: the next record's ``prev``."""
    return hashlib.sha256(data).hexdigest()


def record_hash(record: dict[str, object]) -> str:
    """What ``record``'s ``hash`` must be: SHA-256 hex of its canonical JSON without ``hash``."""
    return line_hash(canonical_json({k: v for k, v in record.items() if k != "hash"}))


def parse_record(line: bytes) -> dict[str, object] | None:
    """A line as an audit record, or ``None`` if it is not JSON or lacks the chain fields."""
    try:
        record = loads_strict(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    seq, prev, digest = record.get("seq"), record.get("prev"), record.get("hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None
    if not isinstance(prev, str) or not isinstance(digest, str):
        return None
    if not isinstance(record.get("event"), str):
        return None
    return record


def read_head(head_path: Path) -> tuple[int, str] | None:
    """``(seq, hash)`` from the head file; ``None`` if absent. A damaged head is a ``StorageError``."""
    try:
        raw = read_private(head_path, max_bytes=4096)
    except FileNotFoundError:
        return None
    try:
        head = loads_strict(raw)
    except ValueError as exc:
        raise StorageError(f"{head_path}: not JSON") from exc
    seq = head.get("seq") if isinstance(head, dict) else None
    digest = head.get("hash") if isinstance(head, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(digest, str):
        raise StorageError(f"{head_path}: not an audit head (want {{'seq': int, 'hash': str}})")
    return seq, digest


@dataclass(frozen=True, slots=True)
class _Tail:
    """The end of an existing log: its last complete line (``None`` if too long to be ours), its record
    if it parses as one, whether any complete line exists, and whether a torn (unterminated) line follows.
    """

    line: bytes | None
    record: dict[str, object] | None
    complete: bool
    torn: bool


def _read_tail(path: Path) -> _Tail:
    """Read backwards from the end until the last complete line is in hand (cheap on a large log)."""
    with open_private(path) as handle:
        pos = handle.seek(0, os.SEEK_END)
        buf = b""
        end = start = -1
        while pos > 0:
            step = min(_TAIL_BLOCK, pos)
            pos -= step
            handle.seek(pos)
            buf = handle.read(step) + buf
            end = buf.rfind(b"\n")  # the newline closing the last complete line
            start = buf.rfind(b"\n", 0, end) + 1 if end >= 0 else -1
            if (end >= 0 and start > 0) or len(buf) > _MAX_LINE:
                break
    torn = bool(buf) and not buf.endswith(b"\n")
    if end < 0:
        return _Tail(None, None, complete=False, torn=torn)
    if start == 0 and pos > 0:
        return _Tail(None, None, complete=True, torn=torn)  # a "line" longer than any record we write
    line = buf[start:end]
    return _Tail(line, parse_record(line), complete=True, torn=torn)


def _scan_last_record(path: Path) -> tuple[bytes | None, dict[str, object] | None]:
    """Slow path when the last line is damaged: the last line anywhere that parses as a record."""
    last: tuple[bytes | None, dict[str, object] | None] = (None, None)
    with open_private(path) as handle:
        for raw in handle:
            if raw.endswith(b"\n"):
                record = parse_record(raw[:-1])
                if record is not None:
                    last = (raw[:-1], record)
    return last


class AuditLog:
    """Appends chained records to one log file. One writer per file: the daemon (it holds the lock file).

    Blocking I/O, but short (one ``write`` per record, no fsync by default), so calling it on the event
    loop is fine; a lock keeps the chain straight if threads share it. Use as a context manager or call
    ``close()`` so the head is flushed.
    """

    def __init__(
        self,
        path: Path,
        *,
        head_path: Path | None = None,
        fsync: bool = False,
        head_every: int = _HEAD_EVERY,
        head_interval: float = _HEAD_INTERVAL,
    ) -> None:
        if head_every < 1:
            raise ValueError("head_every must be at least 1")
        if head_interval < 0:
            raise ValueError("head_interval must not be negative")
        self.path = path
        self.head_path = head_path if head_path is not None else path.with_suffix(".head")
        self._fsync = fsync
        self._head_every = head_every
        self._head_interval = head_interval
        self._head_at = 0.0
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._seq = 0
        self._prev = GENESIS
        self._last_hash = ""
        self._unflushed = 0
        self._head_written = False
        self._open()

    @property
    def seq(self) -> int:
        """The ``seq`` of the last record written (0 for an empty log)."""
        return self._seq

    def _open(self) -> None:
        problems: list[str] = []
        head_unreadable = False
        try:
            head = read_head(self.head_path)
        except StorageError as exc:
            head, head_unreadable = None, True
            problems.append(f"head unreadable ({exc})")  # the next head flush replaces it
        try:
            tail = _read_tail(self.path)
        except FileNotFoundError:
            tail = None
        line, record = (tail.line, tail.record) if tail is not None else (None, None)
        if tail is not None and tail.torn:
            problems.append("last line incomplete (torn write)")
            append_line(self.path, b"")  # end the torn line so our next record starts on a line of its own
        if tail is not None and tail.complete and tail.record is None:
            problems.append("last line is not an audit record")
            line, record = _scan_last_record(self.path)
        if record is not None and line is not None:
            seq = record["seq"]
            if not isinstance(seq, int):  # parse_record checked it; no assert: the daemon runs with -OO
                raise TypeError("audit record seq is not an integer")
            self._seq, self._prev, self._last_hash = seq, line_hash(line), str(record["hash"])
        if head is None:
            if self._seq > 0 and not head_unreadable:
                problems.append("head file missing")
        elif head[0] > self._seq:
            problems.append(f"head says {head[0]} records, log has {self._seq} (truncated)")
        elif head[0] == self._seq and head[0] > 0 and head[1] != self._last_hash:
            problems.append(f"record {self._seq} does not match the head (rewritten)")
        if problems:
            reason = "; ".join(problems)
            logger.warning("audit log %s was damaged while closed: %s; recording it and continuing", self.path, reason)
            self.append(RECOVERED_EVENT, reason=reason, head_seq=head[0] if head else None, log_seq=self._seq)

    def append(self, event: str, /, **fields: object) -> dict[str, object]:
        """Write one record and return it. ``fields`` must be plain JSON and not use a reserved key."""
        if not isinstance(event, str) or not event:
            raise ValueError("audit event must be a non-empty str")
        reserved = RESERVED_KEYS.intersection(fields)
        if reserved:
            raise ValueError(f"audit fields may not be named {sorted(reserved)}: they are the chain's own")
        with self._lock:
            if self._closed:
                raise StorageError(f"audit log {self.path} is closed")
            record: dict[str, object] = {
                "seq": self._seq + 1,
                "ts": utc_timestamp(),
                "event": event,
                **fields,
                "prev": self._prev,
            }
            try:
                # The canonical dump is the type check too: no NaN, no objects, keys sortable.
                record["hash"], line = _seal(record)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"audit fields must be plain JSON (str/int/float/bool/None/list/dict): {exc}") from exc
            line += b"\n"
            if self._fd is None:
                # One checked descriptor for the log's life: re-opening and re-checking it per record would
                # add two system calls and an fstat to every tool call.
                self._fd = open_append(self.path)
            os.write(self._fd, line)
            if self._fsync:
                os.fsync(self._fd)
            self._seq, self._prev, self._last_hash = self._seq + 1, line_hash(line[:-1]), str(record["hash"])
            self._unflushed += 1
            now = time.monotonic()
            if (
                not self._head_written
                or self._unflushed >= self._head_every
                or now - self._head_at >= self._head_interval
            ):
                self._write_head()
                self._head_at = now
        return record

    def _write_head(self) -> None:
        body = json.dumps({"seq": self._seq, "hash": self._last_hash}, sort_keys=True) + "\n"
        write_atomic(self.head_path, body.encode("ascii"))
        self._unflushed = 0
        self._head_written = True

    def close(self) -> None:
        """Flush the head; later appends raise ``StorageError``. Closing twice is harmless."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._unflushed:
                self._write_head()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
