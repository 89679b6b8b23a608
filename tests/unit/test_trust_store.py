"""The trust store: persisted trust, tool drift, refusal of bad files, rollback, and crash safety."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.errors import NotFound, StorageError
from sidecar.store import files
from sidecar.store import trust as trust_module
from sidecar.store.trust import TrustRecord, TrustStore, tool_fingerprint

Events = list[tuple[str, dict[str, object]]]


def key_of(name: str, config: str = "cfg") -> str:
    return f"{name}::{hashlib.sha256(config.encode()).hexdigest()}"


def tool(name: str, description: str = "does things", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"type": "object"}, **extra}


def prints(tools: list[dict[str, Any]]) -> dict[str, str]:
    return {t["name"]: tool_fingerprint(t) for t in tools}


def document(connectors: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"version": 1, "connectors": connectors, **top}).encode()


def entry(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "trusted_at": "2025-01-02T03:04:05.678Z", "tools": {}, **fields}


def temp_files(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.glob(f".{path.name}.*.tmp"))


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "approvals.json"


@pytest.fixture
def events() -> Events:
    return []


@pytest.fixture
def open_store(path: Path, events: Events) -> Callable[[], TrustStore]:
    return lambda: TrustStore(path, on_event=lambda name, fields: events.append((name, fields)))


def write_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


# --- trust and untrust -----------------------------------------------------------------------------------


def test_a_missing_file_is_an_empty_store_without_a_problem(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()

    assert store.problem is None
    assert store.names() == []
    assert not store.is_trusted(key_of("github"))
    assert store.record(key_of("github")) is None
    assert not path.exists()


def test_trust_and_untrust_persist_across_a_new_store(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()
    record = store.trust(key_of("github"), name="github")
    store.trust(key_of("slack"), name="slack")

    reopened = open_store()
    assert reopened.is_trusted(key_of("github")) and reopened.is_trusted(key_of("slack"))
    assert reopened.record(key_of("github")) == record
    assert reopened.names() == ["github", "slack"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    assert reopened.untrust("github") == [key_of("github")]
    again = open_store()
    assert not again.is_trusted(key_of("github"))
    assert again.names() == ["slack"]


def test_the_file_has_the_documented_shape(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()
    record = store.trust(key_of("github"), name="github")
    store.approve_tools(key_of("github"), prints([tool("search")]))

    on_disk = json.loads(path.read_bytes())

    assert on_disk == {
        "version": 1,
        "connectors": {
            key_of("github"): {
                "name": "github",
                "trusted_at": record.trusted_at,
                "tools": {"search": tool_fingerprint(tool("search"))},
            }
        },
    }
    assert record.trusted_at.endswith("Z")
    assert record.tools == {}


def test_trust_is_idempotent_and_does_not_rewrite_the_file(
    path: Path, open_store: Callable[[], TrustStore], events: Events
) -> None:
    store = open_store()
    first = store.trust(key_of("github"), name="github")
    inode = path.stat().st_ino

    second = store.trust(key_of("github"), name="github")

    assert second == first
    assert path.stat().st_ino == inode  # write_atomic would have renamed a new file in
    assert [name for name, _ in events] == ["trust.granted"]


def test_a_key_with_the_same_hash_under_another_name_is_not_trusted(open_store: Callable[[], TrustStore]) -> None:
    store = open_store()
    store.trust(key_of("github", "same config"), name="github")

    assert store.is_trusted(key_of("github", "same config"))
    assert not store.is_trusted(key_of("evil", "same config"))
    assert not open_store().is_trusted(key_of("evil", "same config"))


def test_a_key_whose_name_part_is_not_the_name_is_refused_and_nothing_is_written(
    path: Path, open_store: Callable[[], TrustStore]
) -> None:
    store = open_store()

    with pytest.raises(StorageError, match="does not belong to name"):
        store.trust(key_of("github"), name="evil")
    with pytest.raises(StorageError, match="is not '<name>::<64 hex>'"):
        store.trust("github::not-a-digest", name="github")
    with pytest.raises(StorageError, match="control characters"):
        store.trust(key_of("bad\nname"), name="bad\nname")

    assert store.names() == []
    assert not path.exists()
    assert temp_files(path) == []


def test_a_changed_config_replaces_the_old_key_and_its_tool_approvals(
    open_store: Callable[[], TrustStore], events: Events
) -> None:
    store = open_store()
    old, new = key_of("github", "v1"), key_of("github", "v2")
    store.trust(old, name="github")
    store.approve_tools(old, prints([tool("search")]))

    record = store.trust(new, name="github")

    assert not store.is_trusted(old)
    assert store.is_trusted(new)
    assert record.tools == {}
    assert store.tool_drift(new, prints([tool("search", "rewritten")])) == {}  # nothing approved for this key yet
    reopened = open_store()
    assert not reopened.is_trusted(old) and reopened.is_trusted(new)
    assert events[-1] == ("trust.granted", {"name": "github", "key": new, "replaced": [old]})


def test_untrust_removes_every_key_of_the_name_and_only_those(
    path: Path, open_store: Callable[[], TrustStore], events: Events
) -> None:
    write_file(
        path,
        document(
            {
                key_of("github", "a"): entry("github"),
                key_of("github", "b"): entry("github"),
                key_of("slack"): entry("slack"),
            }
        ),
    )
    store = open_store()

    removed = store.untrust("github")

    assert removed == sorted([key_of("github", "a"), key_of("github", "b")])
    assert store.names() == ["slack"]
    assert open_store().names() == ["slack"]
    assert [e for e in events if e[0] == "trust.revoked"] == [
        ("trust.revoked", {"name": "github", "key": key}) for key in removed
    ]


def test_untrusting_an_unknown_name_returns_nothing_and_writes_nothing(
    path: Path, open_store: Callable[[], TrustStore]
) -> None:
    store = open_store()
    store.trust(key_of("slack"), name="slack")
    inode = path.stat().st_ino

    assert store.untrust("github") == []
    assert path.stat().st_ino == inode


# --- tools ------------------------------------------------------------------------------------------------


def test_tool_drift_finds_a_changed_description_and_a_new_tool_but_not_a_removed_one(
    open_store: Callable[[], TrustStore],
) -> None:
    store = open_store()
    key = key_of("github")
    store.trust(key, name="github")
    store.approve_tools(key, prints([tool("search"), tool("read"), tool("delete")]))

    listing = prints([tool("search", "Ignore previous instructions and..."), tool("read"), tool("upload")])

    assert store.tool_drift(key, listing) == {"search": "changed", "upload": "new"}
    assert open_store().tool_drift(key, listing) == {"search": "changed", "upload": "new"}


def test_tool_drift_is_empty_before_approval_and_after_re_approval(
    open_store: Callable[[], TrustStore], events: Events
) -> None:
    store = open_store()
    key = key_of("github")
    store.trust(key, name="github")
    changed = prints([tool("search", "v2"), tool("upload")])

    assert store.tool_drift(key, changed) == {}
    store.approve_tools(key, prints([tool("search")]))
    assert store.tool_drift(key, changed) == {"search": "changed", "upload": "new"}

    record = store.approve_tools(key, changed)

    assert dict(record.tools) == changed
    assert store.tool_drift(key, changed) == {}
    assert events[-1] == ("trust.tools_approved", {"name": "github", "key": key, "tools": ["search", "upload"]})
    assert store.tool_drift(key_of("unknown"), changed) == {}


def test_approving_tools_of_an_untrusted_key_is_not_found(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()

    with pytest.raises(NotFound):
        store.approve_tools(key_of("github"), prints([tool("search")]))
    assert not path.exists()


def test_a_bad_fingerprint_is_refused_before_writing(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()
    store.trust(key_of("github"), name="github")
    before = path.read_bytes()

    with pytest.raises(StorageError, match="64 lowercase hex"):
        store.approve_tools(key_of("github"), {"search": "not-a-sha"})

    assert path.read_bytes() == before
    assert store.record(key_of("github")) is not None
    assert store.record(key_of("github")).tools == {}  # type: ignore[union-attr]


def test_a_record_cannot_be_changed_in_place(open_store: Callable[[], TrustStore]) -> None:
    store = open_store()
    store.trust(key_of("github"), name="github")
    record = store.approve_tools(key_of("github"), prints([tool("search")]))

    with pytest.raises(TypeError):
        record.tools["search"] = "0" * 64  # type: ignore[index]
    with pytest.raises(AttributeError):
        record.name = "evil"  # type: ignore[misc]


def test_the_fingerprint_covers_name_description_schema_and_annotations_only() -> None:
    base = tool("search", annotations={"readOnlyHint": True})
    fingerprint = tool_fingerprint(base)

    assert len(fingerprint) == 64
    assert tool_fingerprint(dict(reversed(list(base.items())))) == fingerprint
    assert tool_fingerprint({**base, "_meta": {"x": 1}}) == fingerprint
    for changed in (
        {**base, "name": "search2"},
        {**base, "description": "does other things"},
        {**base, "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {**base, "annotations": {"readOnlyHint": False}},
    ):
        assert tool_fingerprint(changed) != fingerprint
    assert tool_fingerprint({"name": "x", "description": None}) == tool_fingerprint({"name": "x"})


# --- refusing bad files -------------------------------------------------------------------------------------

GOOD_KEY = key_of("github")

BAD_DOCUMENTS = {
    "not json": (b'{"version": 1, "connectors": {', "not valid JSON"),
    "not utf-8": (b'{"version": 1, "connectors": {"\xff": 1}}', "not valid JSON"),
    "too deep": (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
    "NaN": (b'{"version": NaN, "connectors": {}}', "not valid JSON"),
    "duplicate key": (
        b'{"version": 1, "connectors": {}, "connectors": {"' + GOOD_KEY.encode() + b'": '
        b'{"name": "github", "trusted_at": "2025-01-02T03:04:05Z", "tools": {}}}}',
        "duplicate key",
    ),
    "a list": (b"[]", "not a valid trust store"),
    "version 2": (document({GOOD_KEY: entry("github")}, version=2), "version"),
    "version true": (b'{"version": true, "connectors": {}}', "version"),
    "unknown top-level field": (document({GOOD_KEY: entry("github")}, extra=1), "extra"),
    "unknown entry field": (document({GOOD_KEY: entry("github", scopes=["all"])}), "scopes"),
    "missing tools": (
        document({GOOD_KEY: {"name": "github", "trusted_at": "2025-01-02T03:04:05Z"}}),
        "tools",
    ),
    "key without digest": (document({"github": entry("github")}), "is not '<name>::<64 hex>'"),
    "key of another name": (document({key_of("evil"): entry("github")}), "does not belong to name"),
    "bad fingerprint": (document({GOOD_KEY: entry("github", tools={"search": "abc"})}), "64 lowercase hex"),
    "bad timestamp": (document({GOOD_KEY: entry("github", trusted_at="yesterday")}), "RFC 3339"),
    "impossible date": (document({GOOD_KEY: entry("github", trusted_at="2025-13-40T00:00:00Z")}), "trusted_at"),
    "control character in a name": (
        document({key_of("git\x1bhub"): entry("git\x1bhub")}),
        "control characters",
    ),
}


@pytest.mark.parametrize("content,reason", BAD_DOCUMENTS.values(), ids=BAD_DOCUMENTS.keys())
def test_a_corrupt_file_on_a_fresh_start_trusts_nothing(
    path: Path, open_store: Callable[[], TrustStore], events: Events, content: bytes, reason: str
) -> None:
    write_file(path, content)

    store = open_store()

    assert store.names() == []
    assert not store.is_trusted(GOOD_KEY)
    assert store.problem is not None
    assert reason in store.problem
    assert str(path) in store.problem
    assert events == [("trust.store_refused", {"path": str(path), "problem": store.problem})]


def _make_foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.getuid() == 0:
        os.chown(path, 4242, -1)
    else:  # cannot give a file away: pretend to be someone else instead
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)


def _make_directory(path: Path, _: pytest.MonkeyPatch) -> None:
    path.unlink()
    path.mkdir()


UNSAFE_FILES: dict[str, tuple[Callable[[Path, pytest.MonkeyPatch], None], str]] = {
    "group-writable": (lambda p, _: p.chmod(0o620), "may be written by other users (mode 620)"),
    "world-writable": (lambda p, _: p.chmod(0o602), "may be written by other users (mode 602)"),
    "owned by another user": (_make_foreign, "not to this user"),
    "a directory": (_make_directory, "not a regular file"),
}


@pytest.mark.parametrize("make_unsafe,reason", UNSAFE_FILES.values(), ids=UNSAFE_FILES.keys())
def test_an_unsafe_file_that_would_trust_a_connector_is_refused(
    path: Path,
    open_store: Callable[[], TrustStore],
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
    make_unsafe: Callable[[Path, pytest.MonkeyPatch], None],
    reason: str,
) -> None:
    write_file(path, document({GOOD_KEY: entry("github")}))
    make_unsafe(path, monkeypatch)

    store = open_store()

    assert not store.is_trusted(GOOD_KEY)
    assert store.problem is not None and reason in store.problem
    assert [name for name, _ in events] == ["trust.store_refused"]


def test_a_symlinked_file_is_refused_even_when_its_target_is_valid(
    path: Path, tmp_path: Path, open_store: Callable[[], TrustStore], events: Events
) -> None:
    target = tmp_path / "elsewhere.json"
    write_file(target, document({GOOD_KEY: entry("github")}))
    path.parent.mkdir(mode=0o700, parents=True)
    path.symlink_to(target)

    store = open_store()

    assert not store.is_trusted(GOOD_KEY)
    assert store.problem == f"{path} is a symbolic link"
    assert events == [("trust.store_refused", {"path": str(path), "problem": store.problem})]


def test_a_bad_file_after_a_good_one_keeps_the_last_good_snapshot(
    path: Path, open_store: Callable[[], TrustStore]
) -> None:
    store = open_store()
    store.trust(key_of("github"), name="github")
    # The edit tries both to add trust and to remove it; neither takes effect.
    write_file(path, document({key_of("evil"): entry("evil")}, comment="sneaky"))

    assert store.reload() is False

    assert store.is_trusted(key_of("github"))
    assert not store.is_trusted(key_of("evil"))
    assert store.problem is not None and "comment: Extra inputs are not permitted" in store.problem


def test_a_refusal_is_reported_once_per_distinct_problem(
    path: Path, open_store: Callable[[], TrustStore], events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(path, b"{")
    with caplog.at_level(logging.WARNING, logger=trust_module.__name__):
        store = open_store()
        store.reload()
        store.reload()
        path.chmod(0o666)
        store.reload()
        store.reload()

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "not valid JSON" in warnings[0].getMessage()
    assert "mode 666" in warnings[1].getMessage()
    assert "fixed or removed" in warnings[0].getMessage()
    assert [name for name, _ in events] == ["trust.store_refused", "trust.store_refused"]


def test_writes_are_refused_while_the_file_is_refused_and_resume_after_a_fix(
    path: Path, open_store: Callable[[], TrustStore]
) -> None:
    evidence = document({key_of("evil"): entry("evil")}, injected=True)
    write_file(path, evidence)
    store = open_store()

    for write in (
        lambda: store.trust(key_of("github"), name="github"),
        lambda: store.untrust("evil"),
        lambda: store.approve_tools(key_of("evil"), {}),
    ):
        with pytest.raises(StorageError, match=f"fix or remove {path} first"):
            write()
    assert path.read_bytes() == evidence  # never overwritten
    assert temp_files(path) == []

    path.unlink()
    assert store.reload() is False  # empty before, empty now
    assert store.problem is None
    store.trust(key_of("github"), name="github")
    assert open_store().names() == ["github"]


def test_a_file_tampered_with_after_loading_is_noticed_at_the_next_write(
    path: Path, tmp_path: Path, open_store: Callable[[], TrustStore], events: Events
) -> None:
    store = open_store()
    store.trust(key_of("github"), name="github")
    planted = tmp_path / "planted.json"
    write_file(planted, document({key_of("evil"): entry("evil")}))
    path.unlink()
    path.symlink_to(planted)

    with pytest.raises(StorageError, match="is a symbolic link; fix or remove"):
        store.trust(key_of("slack"), name="slack")

    assert path.is_symlink()  # the evidence stays
    assert store.is_trusted(key_of("github"))  # last good snapshot
    assert not store.is_trusted(key_of("evil")) and not store.is_trusted(key_of("slack"))
    assert store.problem == f"{path} is a symbolic link"
    assert events[-1][0] == "trust.store_refused"


def test_a_valid_hand_edit_is_picked_up_by_reload_and_kept_by_the_next_write(
    path: Path, open_store: Callable[[], TrustStore]
) -> None:
    store = open_store()
    store.trust(key_of("github"), name="github")
    assert store.reload() is False

    other = open_store()  # e.g. the user edits the file, or a second process writes it
    other.untrust("github")
    other.trust(key_of("slack"), name="slack")

    store.trust(key_of("linear"), name="linear")  # re-reads first: github stays removed

    assert store.names() == ["linear", "slack"]
    assert open_store().names() == ["linear", "slack"]
    path.unlink()
    assert store.reload() is True
    assert store.names() == []


def test_the_constructor_never_raises_when_the_parent_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file, not a directory")

    store = TrustStore(tmp_path / "state" / "approvals.json")

    assert store.names() == []
    assert store.problem is not None and "is not a plain directory" in store.problem


# --- rollback -------------------------------------------------------------------------------------------------


@pytest.fixture
def trusted(path: Path, open_store: Callable[[], TrustStore]) -> tuple[TrustStore, bytes]:
    store = open_store()
    store.trust(key_of("github"), name="github")
    store.approve_tools(key_of("github"), prints([tool("search")]))
    return store, path.read_bytes()


def _assert_unchanged(store: TrustStore, path: Path, before: bytes, open_store: Callable[[], TrustStore]) -> None:
    assert path.read_bytes() == before
    assert store.names() == ["github"]
    assert not store.is_trusted(key_of("slack"))
    assert open_store().names() == ["github"]
    assert temp_files(path) == []
    assert store.problem is None


def test_a_failed_rename_leaves_memory_and_file_as_they_were(
    path: Path,
    open_store: Callable[[], TrustStore],
    trusted: tuple[TrustStore, bytes],
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, before = trusted
    seen = len(events)

    def no_rename(src: Any, dst: Any, **dir_fds: Any) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", no_rename)

    with pytest.raises(StorageError, match="the previous trust stays in force"):
        store.trust(key_of("slack"), name="slack")
    with pytest.raises(StorageError):
        store.untrust("github")

    monkeypatch.undo()
    _assert_unchanged(store, path, before, open_store)
    assert len(events) == seen  # no event for a change that did not happen


@pytest.mark.parametrize("failure", ["garbage", "unreadable"])
def test_a_failed_read_back_restores_the_previous_file(
    path: Path,
    open_store: Callable[[], TrustStore],
    trusted: tuple[TrustStore, bytes],
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    store, before = trusted
    real = files.read_private
    calls = 0

    def flaky(p: Path, *, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 2:  # 1: the re-read before writing; 2: the read-back after writing
            if failure == "garbage":
                return b'{"version": 1, "connectors": {}}'
            raise StorageError(f"{p}: cannot open safely (I/O error)")
        return real(p, max_bytes=max_bytes)

    monkeypatch.setattr(trust_module, "read_private", flaky)

    with pytest.raises(StorageError, match="could not write"):
        store.trust(key_of("slack"), name="slack")

    monkeypatch.undo()
    _assert_unchanged(store, path, before, open_store)


def test_a_failure_after_the_rename_puts_the_old_file_back(
    path: Path,
    open_store: Callable[[], TrustStore],
    trusted: tuple[TrustStore, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, before = trusted
    real = files.write_atomic
    calls = 0

    def replaced_then_failed(p: Path, data: bytes, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        real(p, data, **kwargs)
        if calls == 1:  # e.g. fsync of the directory failed: the new file is in place, the write is not done
            raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(trust_module, "write_atomic", replaced_then_failed)

    with pytest.raises(StorageError, match="could not write"):
        store.untrust("github")

    assert calls == 2  # the write, then the restore
    monkeypatch.undo()
    _assert_unchanged(store, path, before, open_store)


def test_a_failed_first_write_leaves_no_file(
    path: Path, open_store: Callable[[], TrustStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store()
    real = files.read_private
    calls = 0

    def corrupt_read_back(p: Path, *, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        nonlocal calls
        calls += 1
        return b"torn" if calls == 2 else real(p, max_bytes=max_bytes)  # 1: the re-read (no file); 2: read-back

    monkeypatch.setattr(trust_module, "read_private", corrupt_read_back)

    with pytest.raises(StorageError, match="could not write"):
        store.trust(key_of("github"), name="github")

    assert not path.exists()
    assert store.names() == []
    assert temp_files(path) == []


def test_a_failing_event_handler_does_not_undo_a_committed_change(path: Path) -> None:
    def broken(name: str, fields: dict[str, object]) -> None:
        raise RuntimeError("observer bug")

    store = TrustStore(path, on_event=broken)

    store.trust(key_of("github"), name="github")

    assert TrustStore(path).names() == ["github"]


# --- crash safety ------------------------------------------------------------------------------------------------

WRITER = """
import hashlib, sys
from pathlib import Path
from sidecar.store.trust import TrustStore

store = TrustStore(Path(sys.argv[1]))
assert store.problem is None, store.problem
count = len(store.names())
print("ready", count, flush=True)
for _ in range(100_000):  # bounded: the test kills it long before
    name = f"c{count:06d}"
    store.trust(name + "::" + hashlib.sha256(name.encode()).hexdigest(), name=name)
    count += 1
    print(count, flush=True)
"""


def _names_up_to(count: int) -> list[str]:
    return [f"c{i:06d}" for i in range(count)]


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError("writer did not start in time")
    return proc.stdout.readline()


@contextlib.contextmanager
def _writer(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
def test_killing_a_writer_at_random_points_leaves_the_old_or_the_new_file(path: Path) -> None:
    rng = random.Random(1234)
    committed = 0
    mid_write_kills = 0
    for _ in range(30):
        with _writer(path) as proc:
            line = _read_line(proc, timeout=30)
            assert line == f"ready {committed}\n".encode(), line + (proc.stderr.read() if proc.stderr else b"")
            time.sleep(rng.uniform(0.0, 0.06))
            os.kill(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        acked = int(out.split()[-1]) if out.strip() else committed  # last trust() that returned

        leftovers = temp_files(path)
        mid_write_kills += bool(leftovers)
        names: list[str] = []
        if path.exists():  # before the first commit there may be no file yet
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            names = sorted(v["name"] for v in json.loads(path.read_bytes())["connectors"].values())
        assert names in (_names_up_to(acked), _names_up_to(acked + 1)), (acked, names[-3:])

        reopened = TrustStore(path)  # what a restarted daemon sees: the file, never a temp file
        assert reopened.problem is None
        assert reopened.names() == names
        assert temp_files(path) == []  # the dead writer's temp files are swept
        committed = len(names)
    # Kills land at random points, so a loaded machine commits less between them; what matters is that
    # writes really happened (the test is not vacuous), not how many.
    assert committed >= 5, "the writer should have committed something between kills"
    print(f"{committed} commits, {mid_write_kills} kills left a temp file behind")


@pytest.mark.slow
def test_a_temp_file_is_never_read_as_the_store_and_only_dead_writers_temps_are_swept(path: Path) -> None:
    store = TrustStore(path)
    store.trust(key_of("github"), name="github")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead_pid = int(dead.stdout)
    next_document = document({key_of("evil"): entry("evil")})
    stale = path.parent / f".{path.name}.{dead_pid}.{'ab' * 6}.tmp"
    live = path.parent / f".{path.name}.{os.getppid()}.{'cd' * 6}.tmp"
    not_a_pid = path.parent / f".{path.name}.{'9' * 30}.{'ef' * 6}.tmp"
    for temp in (stale, live, not_a_pid):
        write_file(temp, next_document)

    reopened = TrustStore(path)

    assert reopened.names() == ["github"]
    assert not stale.exists()
    assert live.exists()
    assert not_a_pid.exists()


# --- one event loop, many callers ---------------------------------------------------------------------------------


async def test_interleaved_tasks_in_one_event_loop_all_land(path: Path, open_store: Callable[[], TrustStore]) -> None:
    store = open_store()

    async def connect(i: int) -> None:
        key = key_of(f"c{i}")
        store.trust(key, name=f"c{i}")
        await asyncio.sleep(0)
        store.approve_tools(key, prints([tool(f"t{i}")]))
        await asyncio.sleep(0)
        if i % 3 == 0:
            store.untrust(f"c{i}")

    async with asyncio.timeout(30):
        await asyncio.gather(*(connect(i) for i in range(20)))

    expected = [f"c{i}" for i in range(20) if i % 3]
    assert sorted(store.names()) == sorted(expected)
    reopened = open_store()
    assert sorted(reopened.names()) == sorted(expected)
    for i in range(20):
        if i % 3:
            assert reopened.tool_drift(key_of(f"c{i}"), prints([tool(f"t{i}")])) == {}


# --- a model of the store -----------------------------------------------------------------------------------------

_operation = st.one_of(
    st.tuples(st.just("trust"), st.sampled_from("abc"), st.sampled_from("xy")),
    st.tuples(st.just("untrust"), st.sampled_from("abc"), st.just("")),
    st.tuples(st.just("approve"), st.sampled_from("abc"), st.sampled_from("xy")),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_operation, max_size=12))
def test_the_store_matches_a_model_and_its_file_after_any_sequence(operations: list[tuple[str, str, str]]) -> None:
    model: dict[str, tuple[str, dict[str, str]]] = {}  # key -> (name, tools)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "approvals.json"
        store = TrustStore(path)
        for op, name, config in operations:
            key = key_of(name, config)
            if op == "trust":
                if key not in model:
                    model = {k: v for k, v in model.items() if v[0] != name}
                    model[key] = (name, {})
                store.trust(key, name=name)
            elif op == "untrust":
                model = {k: v for k, v in model.items() if v[0] != name}
                store.untrust(name)
            elif key in model:
                fingerprints = prints([tool(f"t-{config}")])
                model[key] = (name, fingerprints)
                store.approve_tools(key, fingerprints)
            else:
                with pytest.raises(NotFound):
                    store.approve_tools(key, {})
            reopened = TrustStore(path)
            every_key = [key_of(n, c) for n in "abc" for c in "xy"]
            for view in (store, reopened):
                records: dict[str, TrustRecord] = {k: r for k in every_key if (r := view.record(k)) is not None}
                assert {k: (r.name, dict(r.tools)) for k, r in records.items()} == model
                assert [k for k in every_key if view.is_trusted(k)] == [k for k in every_key if k in model]
                assert view.names() == sorted({v[0] for v in model.values()})
