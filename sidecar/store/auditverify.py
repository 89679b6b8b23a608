"""``sidecar audit --verify``: check an audit log written by ``sidecar.store.audit`` from end to end.

Streams the file once and reports every problem with the line it is on: a record edited (its hash or
its canonical form), deleted, inserted or reordered (the ``prev`` chain, the ``seq`` run), records cut
off the end (against the head file, back to its last flush), a torn last line, and ``audit.recovered``
records (damage the writer found when it reopened the log). The format is the writer's: this module
only reads it through ``sidecar.store.audit``'s format functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sidecar.canonical import canonical_json
from sidecar.errors import StorageError
from sidecar.store.audit import (
    GENESIS,
    HASH_FORM,
    RECOVERED_EVENT,
    line_hash,
    parse_record,
    read_head,
    record_hash,
)
from sidecar.store.files import loads_strict, open_private

__all__ = ["VerifiedChain", "VerifyReport", "verify"]


@dataclass(slots=True)
class VerifyReport:
    """What ``verify`` found: ``ok`` when ``problems`` is empty. Problems name the line they are on."""

    ok: bool
    records: int
    problems: list[str] = field(default_factory=list)


def verify(path: Path, *, head_path: Path | None = None) -> VerifyReport:
    """Check every record's hash, the chain of ``prev``, the ``seq`` run and the head; stream the file.

    Detects a record edited, deleted, inserted, reordered, and records cut off the end (back to the last
    flushed head). Reports ``audit.recovered`` records (damage found when the log was reopened).
    """
    head_path = head_path if head_path is not None else path.with_suffix(".head")
    problems: list[str] = []
    try:
        head = read_head(head_path)
    except StorageError as exc:
        problems.append(f"head: {exc}")
        head = None
    chain = _Chain(head, problems)
    try:
        with open_private(path) as handle:
            for number, raw in enumerate(handle, start=1):
                chain.check_line(number, raw)
    except FileNotFoundError:
        if head is not None and head[0] > 0:
            problems.append(f"tail: head says {head[0]} records, the log file is missing")
        return VerifyReport(ok=not problems, records=0, problems=problems)
    chain.check_tail(head_damaged=bool(problems) and problems[0].startswith("head:"))
    return VerifyReport(ok=not problems, records=chain.records, problems=problems)


class VerifiedChain:
    """``verify`` of one log for a view that asks often (the console polls): the last report, walked again
    only when the log or its head changed (inode, size or modification time), so an idle log costs two
    ``stat`` calls a poll instead of a walk of the whole file. ``sidecar audit --verify`` always walks."""

    def __init__(self, path: Path, *, head_path: Path | None = None) -> None:
        self.path = path
        self.head_path = head_path if head_path is not None else path.with_suffix(".head")
        self._seen: tuple[tuple[int, int, int] | None, ...] | None = None
        self._report: VerifyReport | None = None

    def report(self) -> VerifyReport:
        stamp = (_stamp(self.path), _stamp(self.head_path))
        if self._report is None or stamp != self._seen:
            self._report = verify(self.path, head_path=self.head_path)
            self._seen = stamp
        return self._report


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns)


class _Chain:
    """``verify``'s walk: what the next line must match, and the problems found so far."""

    def __init__(self, head: tuple[int, str] | None, problems: list[str]) -> None:
        self.head = head
        self.problems = problems
        self.records = 0
        self.last_seq = 0
        self.expected_prev = GENESIS
        self.previous_damaged = False  # the previous line was already reported: skip its knock-on prev
        self.head_record_hash: str | None = None

    def check_line(self, number: int, raw: bytes) -> None:
        if not raw.endswith(b"\n"):
            self.problems.append(f"line {number}: incomplete last line (torn write)")
            return
        line = raw[:-1]
        record = parse_record(line)
        if record is None:
            kind = "not an audit record" if _is_json(line) else "not JSON"
            self.problems.append(f"line {number}: {kind}")
            self.previous_damaged = True
            return
        self.records += 1
        seq = record["seq"]
        if not isinstance(seq, int):  # parse_record checked it; no assert: the daemon runs with -OO
            raise TypeError("audit record seq is not an integer")
        edited = self._check_content(number, line, record)
        if record["prev"] != self.expected_prev and not self.previous_damaged:
            if self.last_seq == 0:
                self.problems.append(f"line {number}: prev is not the start of a chain (records deleted)")
            else:
                self.problems.append(
                    f"line {number}: prev does not match line {number - 1} (record deleted, inserted or reordered)"
                )
        if seq != self.last_seq + 1:
            self.problems.append(f"line {number}: seq {seq} expected {self.last_seq + 1}")
        if record["event"] == RECOVERED_EVENT:
            self.problems.append(f"line {number}: log was damaged while closed: {record.get('reason')}")
        if self.head is not None and seq == self.head[0]:
            self.head_record_hash = str(record["hash"])
        # Follow the file's own numbering after a gap, so one deletion is one problem, not a cascade.
        self.last_seq, self.expected_prev, self.previous_damaged = seq, line_hash(line), edited

    def _check_content(self, number: int, line: bytes, record: dict[str, object]) -> bool:
        if not HASH_FORM.fullmatch(str(record["hash"])) or record["hash"] != record_hash(record):
            self.problems.append(f"line {number}: hash mismatch (record edited)")
            return True
        if line != canonical_json(record):
            self.problems.append(f"line {number}: not in canonical form (record edited)")
            return True
        return False

    def check_tail(self, *, head_damaged: bool) -> None:
        if self.head is None:
            if self.records and not head_damaged:
                self.problems.append("tail: head file missing (truncation cannot be checked)")
        elif self.head[0] > self.last_seq:
            self.problems.append(f"tail: head says {self.head[0]} records, file has {self.last_seq} (truncated)")
        elif self.head[0] > 0 and self.head_record_hash != self.head[1]:
            self.problems.append(f"tail: record {self.head[0]} does not match the head (rewritten)")


def _is_json(line: bytes) -> bool:
    try:
        loads_strict(line)
    except ValueError:
        return False
    return True
