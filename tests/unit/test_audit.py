"""The audit log: a hash chain that notices edits, deletions, reordering, insertions and truncation."""

from __future__ import annotations

import hashlib
import json
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sidecar.store.auditverify
from sidecar.bus.shapes import shape_of
from sidecar.errors import StorageError
from sidecar.store.audit import RESERVED_KEYS, AuditLog
from sidecar.store.auditverify import VerifiedChain, verify


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit.jsonl"


def _write(path: Path, count: int) -> None:
    with AuditLog(path) as log:
        for i in range(count):
            log.append("tool.call", tool=f"t{i}", decision="allow", duration_ms=i)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _set_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def test_a_fresh_log_verifies_and_numbers_records_from_one(log_path: Path) -> None:
    _write(log_path, 10)

    report = verify(log_path)

    assert report.ok, report.problems
    assert report.records == 10
    records = [json.loads(line) for line in _lines(log_path)]
    assert [r["seq"] for r in records] == list(range(1, 11))
    assert records[0]["prev"] == "0" * 64
    assert records[3]["tool"] == "t3"
    assert records[0]["ts"].endswith("Z") and len(records[0]["ts"]) == len("2025-01-02T03:04:05.678Z")


def test_a_verified_chain_walks_again_only_when_the_log_changed(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[Path] = []

    def counted(path: Path, *, head_path: Path | None = None) -> object:
        walks.append(path)
        return verify(path, head_path=head_path)

    monkeypatch.setattr(sidecar.store.auditverify, "verify", counted)
    _write(log_path, 3)
    chain = VerifiedChain(log_path)

    assert chain.report().records == 3
    assert chain.report().ok and len(walks) == 1  # nothing changed: the last verdict
    with AuditLog(log_path) as log:
        log.append("tool.call", tool="later")
    assert chain.report().records == 4 and len(walks) == 2
    lines = _lines(log_path)
    lines[1] = lines[1].replace(b'"decision":"allow"', b'"decision":"deny!"')  # an edit in place
    _set_lines(log_path, lines)
    report = chain.report()
    assert not report.ok and report.problems[0].startswith("line 2: hash mismatch")
    assert len(walks) == 3


def test_append_returns_the_record_it_wrote(log_path: Path) -> None:
    with AuditLog(log_path) as log:
        record = log.append("trust.grant", connector="github")
    written = json.loads(log_path.read_bytes())
    assert written == record
    assert written["event"] == "trust.grant"
    assert written["connector"] == "github"


def test_log_and_head_are_private_files(log_path: Path) -> None:
    _write(log_path, 3)

    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_path.with_suffix(".head").stat().st_mode) == 0o600


def test_an_edited_field_is_a_hash_mismatch_on_its_line(log_path: Path) -> None:
    _write(log_path, 6)
    lines = _lines(log_path)
    lines[2] = lines[2].replace(b'"decision":"allow"', b'"decision":"deny"')
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert report.problems == ["line 3: hash mismatch (record edited)"]


def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(log_path: Path) -> None:
    _write(log_path, 6)
    lines = _lines(log_path)
    forged = json.loads(lines[2])
    forged["decision"] = "deny"
    del forged["hash"]
    canonical = json.dumps(forged, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    forged["hash"] = hashlib.sha256(canonical.encode()).hexdigest()
    lines[2] = json.dumps(forged, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert report.problems[0].startswith("line 4: prev does not match line 3")


def test_a_deleted_middle_line_is_detected_where_the_gap_is(log_path: Path) -> None:
    _write(log_path, 6)
    lines = _lines(log_path)
    del lines[3]
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert "line 4: prev does not match line 3 (record deleted, inserted or reordered)" in report.problems
    assert "line 4: seq 5 expected 4" in report.problems
    assert all(p.startswith("line 4:") for p in report.problems)


def test_a_deleted_first_line_is_detected(log_path: Path) -> None:
    _write(log_path, 4)
    _set_lines(log_path, _lines(log_path)[1:])

    report = verify(log_path)

    assert not report.ok
    assert report.problems[0] == "line 1: prev is not the start of a chain (records deleted)"


def test_two_swapped_lines_are_detected(log_path: Path) -> None:
    _write(log_path, 6)
    lines = _lines(log_path)
    lines[2], lines[3] = lines[3], lines[2]
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert "line 3: seq 4 expected 3" in report.problems
    assert any(p.startswith("line 3: prev does not match line 2") for p in report.problems)


def test_truncating_the_last_two_lines_is_detected_through_the_head(log_path: Path) -> None:
    _write(log_path, 12)
    _set_lines(log_path, _lines(log_path)[:-2])

    report = verify(log_path)

    assert not report.ok
    assert report.problems == ["tail: head says 12 records, file has 10 (truncated)"]


def test_truncation_is_detected_back_to_the_last_flushed_head(log_path: Path) -> None:
    """The documented trade-off: records after the last head flush can go unnoticed, earlier ones not."""
    log = AuditLog(log_path, head_every=5)
    for i in range(12):  # head flushed at the first append, then every 5: at 1, 6, 11 — not at 12
        log.append("tool.call", n=i)
    lines = _lines(log_path)

    _set_lines(log_path, lines[:11])
    assert verify(log_path).ok  # cut after the last flush: not visible

    _set_lines(log_path, lines[:10])
    assert verify(log_path).problems == ["tail: head says 11 records, file has 10 (truncated)"]

    _set_lines(log_path, lines)
    log.close()  # close flushes: now every record is covered
    _set_lines(log_path, lines[:11])
    assert verify(log_path).problems == ["tail: head says 12 records, file has 11 (truncated)"]


def test_a_forged_record_inserted_in_the_middle_is_detected(log_path: Path) -> None:
    _write(log_path, 5)
    lines = _lines(log_path)
    previous = json.loads(lines[1])
    forged = dict(previous, event="trust.grant", connector="evil")
    lines.insert(2, json.dumps(forged, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert report.problems[0] == "line 3: hash mismatch (record edited)"


def test_a_well_formed_forged_record_appended_at_the_end_is_detected(log_path: Path) -> None:
    _write(log_path, 4)
    lines = _lines(log_path)
    forged: dict[str, object] = {
        "seq": 5,
        "ts": "2030-01-01T00:00:00.000Z",
        "event": "approval.allow",
        "prev": "0" * 64,  # the forger does not bother with the chain
    }
    forged["hash"] = hashlib.sha256(json.dumps(forged, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    lines.append(json.dumps(forged, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert report.problems == ["line 5: prev does not match line 4 (record deleted, inserted or reordered)"]


def test_a_line_that_is_not_json_is_named(log_path: Path) -> None:
    _write(log_path, 3)
    lines = _lines(log_path)
    lines[1] = b"{not json\n"
    _set_lines(log_path, lines)

    report = verify(log_path)

    assert not report.ok
    assert report.problems[0] == "line 2: not JSON"


def test_reopening_continues_the_chain(log_path: Path) -> None:
    _write(log_path, 3)

    with AuditLog(log_path) as log:
        assert log.seq == 3
        record = log.append("session.new", session="s1")

    assert record["seq"] == 4
    assert record["prev"] == hashlib.sha256(_lines(log_path)[2].rstrip(b"\n")).hexdigest()
    report = verify(log_path)
    assert report.ok, report.problems
    assert report.records == 4


def test_reopening_a_large_log_reads_only_its_tail(log_path: Path) -> None:
    _write(log_path, 300)  # well past one 8 KiB block

    with AuditLog(log_path) as log:
        assert log.append("tool.call")["seq"] == 301
    assert verify(log_path).ok


def test_reopening_after_truncation_records_the_damage_before_continuing(log_path: Path) -> None:
    _write(log_path, 8)
    _set_lines(log_path, _lines(log_path)[:-3])

    with AuditLog(log_path) as log:
        log.append("tool.call")

    records = [json.loads(line) for line in _lines(log_path)]
    assert records[5]["event"] == "audit.recovered"
    assert records[5]["seq"] == 6
    assert records[5]["head_seq"] == 8
    report = verify(log_path)
    assert not report.ok  # the head now agrees with the file, but the recovery record keeps the evidence
    assert report.problems == ["line 6: log was damaged while closed: head says 8 records, log has 5 (truncated)"]


def test_reopening_after_a_torn_write_ends_the_torn_line_and_carries_on(log_path: Path) -> None:
    _write(log_path, 3)
    with log_path.open("ab") as handle:
        handle.write(b'{"seq":4,"ev')  # a crash in the middle of a write

    with AuditLog(log_path) as log:
        log.append("tool.call")

    records = _lines(log_path)
    assert records[3] == b'{"seq":4,"ev\n'
    assert json.loads(records[4])["event"] == "audit.recovered"
    report = verify(log_path)
    assert "line 4: not JSON" in report.problems
    assert not any("prev" in p for p in report.problems)  # the chain skips the torn line


def test_a_torn_last_line_is_reported(log_path: Path) -> None:
    _write(log_path, 2)
    with log_path.open("ab") as handle:
        handle.write(b'{"seq":3')

    assert verify(log_path).problems == ["line 3: incomplete last line (torn write)"]


def test_a_missing_head_is_reported(log_path: Path) -> None:
    _write(log_path, 2)
    log_path.with_suffix(".head").unlink()

    assert verify(log_path).problems == ["tail: head file missing (truncation cannot be checked)"]


def test_a_missing_log_with_a_head_is_reported(log_path: Path) -> None:
    _write(log_path, 2)
    log_path.unlink()

    report = verify(log_path)

    assert report.problems == ["tail: head says 2 records, the log file is missing"]


def test_no_log_at_all_verifies_as_empty(log_path: Path) -> None:
    report = verify(log_path)
    assert report.ok
    assert report.records == 0


def test_a_custom_head_path_is_used(tmp_path: Path) -> None:
    path, head = tmp_path / "a" / "log.jsonl", tmp_path / "a" / "elsewhere.json"
    with AuditLog(path, head_path=head) as log:
        log.append("x")
    assert json.loads(head.read_bytes())["seq"] == 1
    assert verify(path, head_path=head).ok


@pytest.mark.parametrize("key", sorted(RESERVED_KEYS))
def test_fields_named_like_the_chain_are_refused(log_path: Path, key: str) -> None:
    with AuditLog(log_path) as log, pytest.raises(ValueError, match=key):
        log.append("tool.call", **{key: "forged"})
    assert not log_path.exists()


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", float("nan")])
def test_fields_that_are_not_plain_json_are_refused(log_path: Path, value: object) -> None:
    with AuditLog(log_path) as log, pytest.raises((TypeError, ValueError), match="plain JSON"):
        log.append("tool.call", value=value)
    assert not log_path.exists()


def test_appending_after_close_is_an_error(log_path: Path) -> None:
    log = AuditLog(log_path)
    log.close()
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.append("tool.call")


def test_a_log_writable_by_others_is_refused(log_path: Path) -> None:
    _write(log_path, 1)
    log_path.chmod(0o666)

    with pytest.raises(StorageError, match="other users"):
        AuditLog(log_path)
    with pytest.raises(StorageError, match="other users"):
        verify(log_path)


def test_shape_of_keeps_types_and_keys_only() -> None:
    shape = shape_of({"a": "x", "b": {"c": 1}, "l": ["s", "t"], "f": 1.5, "t": True, "n": None, "e": []})
    assert shape == {
        "a": "str",
        "b": {"c": "int"},
        "l": ["str"],
        "f": "float",
        "t": "bool",
        "n": "null",
        "e": [],
    }
    assert shape_of([1, "x", 2, {"k": 1}]) == ["int", "str", {"k": "int"}]
    assert shape_of("secret") == "str"
    assert shape_of(object()) == "object"


def test_shape_of_hides_keys_that_may_be_data() -> None:
    shape = shape_of({"to": "x", "alice@example.com": 1, "has space": 2})
    assert shape == {"to": "str", "…": "2 more keys"}


def test_shape_of_is_bounded_in_depth_and_size() -> None:
    deep: object = "leaf"
    for _ in range(50):
        deep = {"k": [deep]}
    wide = {f"k{i}": {f"j{j}": j for j in range(100)} for i in range(100)}

    assert len(json.dumps(shape_of(deep))) < 200
    assert len(json.dumps(shape_of(wide))) < 10_000
    assert len(json.dumps(shape_of(list(range(10**5))))) < 100


def test_secrets_in_arguments_never_reach_the_file(log_path: Path) -> None:
    secret = "ghp_s3cr3tT0k3nValue"
    arguments = {"token": secret, "nested": {"password": secret, "list": [secret, {"k": secret}]}}
    with AuditLog(log_path) as log:
        log.append("tool.call", tool="github.create_issue", args=shape_of(arguments))

    written = log_path.read_bytes() + log_path.with_suffix(".head").read_bytes()
    assert secret.encode() not in written
    assert json.loads(log_path.read_bytes())["args"] == {
        "token": "str",
        "nested": {"password": "str", "list": ["str", {"k": "str"}]},
    }


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(_json, min_size=1, max_size=5), victim=st.integers(min_value=0))
def test_any_single_byte_change_is_detected(
    tmp_path_factory: pytest.TempPathFactory, values: list[object], victim: int
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "audit.jsonl"
    with AuditLog(path) as log:
        for value in values:
            log.append("tool.call", value=value)
    assert verify(path).ok
    data = bytearray(path.read_bytes())
    index = victim % len(data)
    data[index] = ord("x") if data[index] != ord("x") else ord("y")
    path.write_bytes(bytes(data))

    assert not verify(path).ok


def test_rewriting_the_last_record_with_a_valid_hash_is_caught_by_the_head(log_path: Path) -> None:
    _write(log_path, 4)
    lines = _lines(log_path)
    forged = json.loads(lines[-1])
    forged["decision"] = "deny"
    del forged["hash"]
    canonical = json.dumps(forged, sort_keys=True, separators=(",", ":")).encode()
    forged["hash"] = hashlib.sha256(canonical).hexdigest()
    lines[-1] = json.dumps(forged, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    _set_lines(log_path, lines)

    assert verify(log_path).problems == ["tail: record 4 does not match the head (rewritten)"]


def test_a_damaged_head_is_reported_and_replaced_on_reopen(log_path: Path) -> None:
    _write(log_path, 2)
    log_path.with_suffix(".head").write_bytes(b"garbage")
    assert verify(log_path).problems[0].startswith("head: ")

    with AuditLog(log_path) as log:
        log.append("tool.call")

    records = [json.loads(line) for line in _lines(log_path)]
    assert records[2]["event"] == "audit.recovered"
    assert records[2]["reason"].startswith("head unreadable")
    assert verify(log_path).problems == [f"line 3: log was damaged while closed: {records[2]['reason']}"]


_field_names = st.sampled_from(["a", "has", "hasg", "hasha", "hash_", "hat", "Hash", "zz", "é", "ü", "ß"]) | st.text(
    min_size=1, max_size=6
).filter(lambda k: k not in RESERVED_KEYS)


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(_field_names, _json, max_size=6))
def test_each_line_is_the_canonical_json_of_its_record_and_hashes_to_it(
    tmp_path_factory: pytest.TempPathFactory, fields: dict[str, object]
) -> None:
    path = tmp_path_factory.mktemp("canon") / "audit.jsonl"
    with AuditLog(path) as log:
        record = log.append("tool.call", **fields)
    line = path.read_bytes().removesuffix(b"\n")

    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert line == canonical.encode("ascii")
    unhashed = {k: v for k, v in record.items() if k != "hash"}
    digest = hashlib.sha256(
        json.dumps(unhashed, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    ).hexdigest()
    assert record["hash"] == digest
    assert verify(path).ok


def test_timestamps_are_utc_wall_clock_to_the_millisecond(log_path: Path) -> None:
    before = datetime.now(UTC)
    with AuditLog(log_path) as log:
        stamp = str(log.append("x")["ts"])
    after = datetime.now(UTC)

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    written = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= written <= after
