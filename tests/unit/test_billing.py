"""The billing gate: listed tools ask, unlisted ones are free, and anything wrong with a manifest asks."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.bus import billing
from sidecar.bus.billing import UNVERIFIABLE, BillingGate, GateVerdict, ManifestSource, load_manifest
from tests.helpers import write_config

REPO = Path(__file__).resolve().parents[2]

GOOD: dict[str, Any] = {
    "version": 1,
    "tools": {"gen_image": {"approvalKind": "image-generation", "group": "images"}},
}


class Clock:
    """A hand-driven monotonic clock: the gate's recheck interval passes only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds


def _gate(*sources: ManifestSource, clock: Clock | None = None) -> BillingGate:
    return BillingGate(sources, clock=clock or Clock(), recheck_seconds=1.0)


def _builtin(path: Path, *, required: bool = True) -> ManifestSource:
    return ManifestSource(scope="builtin", path=path, required=required)


def _assert_closed(verdict: GateVerdict, path: Path) -> None:
    assert verdict.billable
    assert verdict.kind == UNVERIFIABLE
    assert verdict.group is None
    assert str(path) in verdict.reason


def test_a_listed_tool_is_billable_with_its_kind_and_group(tmp_path: Path) -> None:
    path = write_config(tmp_path / "m.json", GOOD)
    verdict = _gate(_builtin(path)).check(scope="builtin", tool="gen_image")
    assert verdict == GateVerdict(billable=True, kind="image-generation", group="images", reason=f"listed in {path}")


def test_an_unlisted_tool_is_free(tmp_path: Path) -> None:
    path = write_config(tmp_path / "m.json", GOOD)
    assert _gate(_builtin(path)).check(scope="builtin", tool="calc") is GateVerdict.FREE


def test_a_scope_without_sources_is_free(tmp_path: Path) -> None:
    path = write_config(tmp_path / "m.json", "not json")
    gate = _gate(_builtin(path))
    assert gate.check(scope="connector:github", tool="gen_image") is GateVerdict.FREE


def _symlink_to_a_good_file(path: Path) -> None:
    target = write_config(path.parent / "real.json", GOOD)
    path.symlink_to(target)


def _someone_elses_file(path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("a file owned by another user cannot be made without root")
    write_config(path, GOOD)
    os.chown(path, 4242, -1)


def _text(text: str) -> Callable[[Path], None]:
    return lambda path: write_config(path, text) and None


def _json(value: Any) -> Callable[[Path], None]:
    return lambda path: write_config(path, value) and None


def _entry(**entry: Any) -> Callable[[Path], None]:
    return _json({"version": 1, "tools": {"gen_image": entry}})


# (case, make the broken file, what the reason must contain — alternatives separated by "|")
BROKEN: list[tuple[str, Callable[[Path], None], str]] = [
    ("missing required file", lambda path: None, "missing"),
    ("empty file", _text(""), "not valid JSON"),
    ("invalid JSON", _text('{"version": 1, "tools": {'), "not valid JSON"),
    ("JSON array", _json([]), "the top level must be an object, got a list"),
    ("version 2", _json({"version": 2, "tools": {}}), "version"),
    ("version true", _text('{"version": true, "tools": {}}'), "version"),
    ("version 1.0", _text('{"version": 1.0, "tools": {}}'), "version"),
    ("missing tools", _json({"version": 1}), "tools"),
    ("tools is a list", _json({"version": 1, "tools": []}), "tools"),
    ("unknown top-level key", _json({**GOOD, "extra": 1}), "extra"),
    ("duplicate tools key", _text('{"version": 1, "tools": {"gen_image": {}}, "tools": {}}'), "duplicate key"),
    ("entry missing group", _entry(approvalKind="image-generation"), "tools.gen_image.group"),
    ("entry with unknown key", _entry(approvalKind="k", group="images", cost=3), "tools.gen_image.cost"),
    ("entry snake_case kind", _entry(approval_kind="k", group="images"), "tools.gen_image"),
    ("group uppercase", _entry(approvalKind="k", group="Images"), "tools.gen_image.group"),
    ("group with space", _entry(approvalKind="k", group="my images"), "tools.gen_image.group"),
    ("group trailing newline", _entry(approvalKind="k", group="images\n"), "tools.gen_image.group"),
    ("group too long", _entry(approvalKind="k", group="g" * 65), "tools.gen_image.group"),
    ("approvalKind empty", _entry(approvalKind="", group="images"), "tools.gen_image.approvalKind"),
    ("approvalKind not a string", _entry(approvalKind=1, group="images"), "tools.gen_image.approvalKind"),
    ("entry is null", _json({"version": 1, "tools": {"gen_image": None}}), "tools.gen_image"),
    ("bad tool name", _json({"version": 1, "tools": {"gen image": GOOD["tools"]["gen_image"]}}), "tools['gen image']"),
    ("tool name too long", _json({"version": 1, "tools": {"t" * 129: GOOD["tools"]["gen_image"]}}), "tools['ttt"),
    ("NaN", _text('{"version": NaN, "tools": {}}'), "NaN"),
    ("symlink", _symlink_to_a_good_file, "cannot open safely"),
    (
        "world-writable (0666)",
        lambda path: write_config(path, GOOD, mode=0o666) and None,
        "may be written by other users",
    ),
    (
        "group-writable (0620)",
        lambda path: write_config(path, GOOD, mode=0o620) and None,
        "may be written by other users",
    ),
    ("owned by someone else", _someone_elses_file, "belongs to uid"),
    # files.open_private fails in os.fdopen (IsADirectoryError) before its own S_ISREG check.
    ("directory instead of file", lambda path: path.mkdir(), "not a regular file|Is a directory"),
]


@pytest.mark.parametrize(("make", "fragment"), [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN])
def test_a_broken_manifest_fails_closed_for_every_tool_of_its_scope(
    tmp_path: Path, make: Callable[[Path], None], fragment: str
) -> None:
    path = tmp_path / "high-credit-tools.json"
    make(path)
    gate = _gate(_builtin(path))
    for tool in ("gen_image", "calc"):
        verdict = gate.check(scope="builtin", tool=tool)
        _assert_closed(verdict, path)
        assert any(alternative in verdict.reason for alternative in fragment.split("|"))
    assert gate.check(scope="connector:other", tool="gen_image") is GateVerdict.FREE
    [problem] = gate.problems()
    assert problem == verdict.reason


def test_an_optional_source_that_is_missing_has_no_entries(tmp_path: Path) -> None:
    gate = _gate(_builtin(tmp_path / "absent.json", required=False))
    assert gate.check(scope="builtin", tool="gen_image") is GateVerdict.FREE
    assert gate.problems() == []


def test_an_optional_source_that_is_present_but_broken_fails_closed(tmp_path: Path) -> None:
    path = write_config(tmp_path / "m.json", {"version": 1, "tools": {"gen_image": {"group": "images"}}})
    verdict = _gate(_builtin(path, required=False)).check(scope="builtin", tool="calc")
    _assert_closed(verdict, path)
    assert "tools.gen_image.approvalKind" in verdict.reason


def test_fixing_the_file_restores_verdicts_after_the_recheck_interval(tmp_path: Path) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", {"version": 2})
    gate = _gate(_builtin(path), clock=clock)
    _assert_closed(gate.check(scope="builtin", tool="calc"), path)

    write_config(path, GOOD)
    clock.advance(0.5)
    _assert_closed(gate.check(scope="builtin", tool="calc"), path)  # not re-checked yet
    clock.advance(0.5)
    assert gate.check(scope="builtin", tool="calc") is GateVerdict.FREE
    assert gate.check(scope="builtin", tool="gen_image").group == "images"
    assert gate.problems() == []


def test_a_good_manifest_that_breaks_fails_closed_instead_of_keeping_the_last_good_copy(tmp_path: Path) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", GOOD)
    gate = _gate(_builtin(path), clock=clock)
    assert gate.check(scope="builtin", tool="gen_image").group == "images"

    write_config(path, "{")
    clock.advance()
    _assert_closed(gate.check(scope="builtin", tool="gen_image"), path)
    _assert_closed(gate.check(scope="builtin", tool="calc"), path)


def test_chmod_alone_fixes_a_world_writable_manifest(tmp_path: Path) -> None:
    # chmod changes neither mtime, size nor inode: the gate must still notice.
    clock = Clock()
    path = write_config(tmp_path / "m.json", GOOD, mode=0o666)
    gate = _gate(_builtin(path), clock=clock)
    _assert_closed(gate.check(scope="builtin", tool="gen_image"), path)
    os.chmod(path, 0o600)
    clock.advance()
    assert gate.check(scope="builtin", tool="gen_image").kind == "image-generation"


def test_an_unchanged_manifest_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", GOOD)
    reads: list[Path] = []
    real = billing.load_manifest

    def counting(p: Path) -> Any:
        reads.append(p)
        return real(p)

    monkeypatch.setattr(billing, "load_manifest", counting)
    gate = _gate(_builtin(path), clock=clock)
    for _ in range(5):
        gate.check(scope="builtin", tool="gen_image")
        clock.advance()
    assert reads == [path]


def test_the_file_is_stat_ed_at_most_once_per_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", GOOD)
    stats: list[Path] = []
    real = billing._stat_key

    def counting(p: Path) -> Any:
        stats.append(p)
        return real(p)

    monkeypatch.setattr(billing, "_stat_key", counting)
    gate = _gate(_builtin(path), clock=clock)
    for _ in range(10):
        gate.check(scope="builtin", tool="gen_image")
        clock.advance(0.25)
    assert len(stats) == 3  # at t=0, 1.0 and 2.0


def test_one_warning_per_distinct_problem_not_per_call(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", "{")
    gate = _gate(_builtin(path), clock=clock)
    with caplog.at_level(logging.WARNING, logger=billing.__name__):
        for _ in range(5):
            gate.check(scope="builtin", tool="gen_image")
            clock.advance()
        write_config(path, {"version": 2, "tools": {}})
        for _ in range(5):
            gate.check(scope="builtin", tool="gen_image")
            clock.advance()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "not valid JSON" in warnings[0].getMessage() and "version" in warnings[1].getMessage()


def test_an_exception_while_parsing_fails_closed_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    path = write_config(tmp_path / "m.json", GOOD)

    def boom(p: Path) -> Any:
        raise RuntimeError("secret-ish detail")

    monkeypatch.setattr(billing, "load_manifest", boom)
    gate = _gate(_builtin(path), clock=clock)
    with caplog.at_level(logging.WARNING, logger=billing.__name__):
        for tool in ("gen_image", "calc", "calc"):
            verdict = gate.check(scope="builtin", tool=tool)
            _assert_closed(verdict, path)
            assert "RuntimeError" in verdict.reason and "secret-ish" not in verdict.reason
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.exc_info is not None  # the traceback is logged, once

    monkeypatch.undo()
    clock.advance()
    assert gate.check(scope="builtin", tool="gen_image").group == "images"


def test_an_exception_anywhere_in_the_gate_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path / "m.json", GOOD)
    gate = _gate(_builtin(path))

    def boom(self: BillingGate, scope: str, tool: str) -> GateVerdict:
        raise KeyError(tool)

    monkeypatch.setattr(BillingGate, "_check", boom)
    with caplog.at_level(logging.WARNING, logger=billing.__name__):
        for _ in range(3):
            verdict = gate.check(scope="connector:none", tool="calc")
            assert (verdict.billable, verdict.kind, verdict.group) == (True, UNVERIFIABLE, None)
            assert "KeyError" in verdict.reason
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert any("KeyError" in problem for problem in gate.problems())


def test_an_exception_in_stat_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path / "m.json", GOOD)

    def boom(p: Path) -> Any:
        raise ValueError("bad")

    monkeypatch.setattr(billing, "_stat_key", boom)
    verdict = _gate(_builtin(path)).check(scope="builtin", tool="calc")
    assert (verdict.billable, verdict.kind, verdict.group) == (True, UNVERIFIABLE, None)


def test_two_sources_for_one_scope_are_a_union(tmp_path: Path) -> None:
    shipped = write_config(tmp_path / "shipped.json", GOOD)
    user = write_config(
        tmp_path / "user.json", {"version": 1, "tools": {"gen_video": {"approvalKind": "video", "group": "video"}}}
    )
    gate = _gate(_builtin(shipped), _builtin(user, required=False))
    assert gate.check(scope="builtin", tool="gen_image").group == "images"
    video = gate.check(scope="builtin", tool="gen_video")
    assert (video.billable, video.kind, video.group, video.reason) == (True, "video", "video", f"listed in {user}")
    assert gate.check(scope="builtin", tool="calc") is GateVerdict.FREE


def test_one_broken_source_closes_the_whole_scope(tmp_path: Path) -> None:
    clock = Clock()
    shipped = write_config(tmp_path / "shipped.json", GOOD)
    user = write_config(tmp_path / "user.json", {"version": 1, "tools": {}})
    gate = _gate(_builtin(shipped), clock=clock)
    gate.add_source(_builtin(user, required=False))
    assert gate.check(scope="builtin", tool="calc") is GateVerdict.FREE

    write_config(user, {"version": 1, "tools": {}, "oops": True})
    clock.advance()
    for tool in ("gen_image", "calc"):
        _assert_closed(gate.check(scope="builtin", tool=tool), user)
    assert gate.problems() == [f"{user}: oops: unknown key (a typo?)"]


def test_sources_for_other_scopes_do_not_interfere(tmp_path: Path) -> None:
    builtin = write_config(tmp_path / "builtin.json", GOOD)
    connector = write_config(tmp_path / "connector.json", "[")
    gate = _gate(_builtin(builtin), ManifestSource(scope="connector:media", path=connector, required=True))
    assert gate.check(scope="builtin", tool="gen_image").group == "images"
    assert gate.check(scope="builtin", tool="calc") is GateVerdict.FREE
    _assert_closed(gate.check(scope="connector:media", tool="gen_image"), connector)


def test_problems_lists_the_current_problems(tmp_path: Path) -> None:
    clock = Clock()
    good = write_config(tmp_path / "good.json", GOOD)
    bad = write_config(tmp_path / "bad.json", {"version": 1, "tools": {"x": {"approvalKind": "", "group": "g"}}})
    missing = tmp_path / "missing.json"
    gate = _gate(_builtin(good), _builtin(bad), ManifestSource("plugin:p", missing, required=True), clock=clock)
    problems = gate.problems()
    assert len(problems) == 2
    assert problems[0].startswith(f"{bad}: tools.x.approvalKind:")
    assert problems[1] == f"{missing}: required billing manifest is missing"

    write_config(bad, GOOD)
    write_config(missing, GOOD)
    clock.advance()
    assert gate.problems() == []


def test_the_shipped_manifest_validates() -> None:
    shipped = REPO / "config" / billing.MANIFEST_NAME
    assert load_manifest(shipped) == {}
    gate = _gate(_builtin(shipped))
    assert gate.problems() == []
    assert gate.check(scope="builtin", tool="calculator") is GateVerdict.FREE
