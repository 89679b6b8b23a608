"""A file is only as safe as every directory above it (issue 11 item 4): ``check_directory_chain`` and the
one disk writer, which never writes into a directory that others may change."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from sidecar.errors import StorageError
from sidecar.store.files import check_directory_chain, ensure_private_dir, write_atomic


@pytest.fixture
def root(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "state" / "sub").mkdir(parents=True, mode=0o700)
    for directory in (home, home / "state", home / "state" / "sub"):
        directory.chmod(0o700)
    return home


def test_a_private_path_passes(root: Path) -> None:
    check_directory_chain(root / "state" / "sub", root=root / "state")


def test_a_directory_that_does_not_exist_yet_holds_nothing(root: Path) -> None:
    check_directory_chain(root / "state" / "not-yet" / "deeper", root=root / "state")


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=["group", "others", "sticky"])
def test_a_directory_of_ours_others_may_write_is_refused_even_with_the_sticky_bit(root: Path, mode: int) -> None:
    (root / "state").chmod(mode)
    with pytest.raises(StorageError, match=re.escape(f"{root / 'state'} may be written by other users")):
        check_directory_chain(root / "state" / "sub", root=root / "state")


def test_a_symlink_among_our_own_directories_is_refused(root: Path, tmp_path: Path) -> None:
    (root / "state" / "sub").rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (root / "state" / "sub").symlink_to(elsewhere)
    with pytest.raises(StorageError, match="is not a plain directory"):
        check_directory_chain(root / "state" / "sub", root=root / "state")


def test_above_our_directories_only_a_sticky_directory_may_be_writable_by_others(root: Path) -> None:
    root.chmod(0o1777)
    check_directory_chain(root / "state", root=root / "state")
    root.chmod(0o777)
    with pytest.raises(StorageError, match=re.escape(f"{root} may be written by other users (mode 777)")):
        check_directory_chain(root / "state", root=root / "state")


def test_a_symlink_above_counts_by_where_it_points(tmp_path: Path) -> None:
    # The path as written is safe all the way; the directory the link leads into is not.
    open_dir = tmp_path / "shared"
    (open_dir / "real" / "state").mkdir(parents=True)
    (open_dir / "real").chmod(0o700)
    (open_dir / "real" / "state").chmod(0o700)
    open_dir.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(open_dir / "real")
    with pytest.raises(StorageError, match=re.escape(f"{open_dir} may be written by other users")):
        check_directory_chain(link / "state", root=link / "state")


def test_a_symlink_above_counts_by_where_it_lives(tmp_path: Path) -> None:
    # The link's target is safe; the directory that holds the link is not (anyone may re-point it).
    safe = tmp_path / "safe"
    (safe / "state").mkdir(parents=True)
    safe.chmod(0o700)
    (safe / "state").chmod(0o700)
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    (open_dir / "link").symlink_to(safe)
    open_dir.chmod(0o777)
    with pytest.raises(StorageError, match=re.escape(f"{open_dir} may be written by other users")):
        check_directory_chain(open_dir / "link" / "state", root=open_dir / "link" / "state")


@pytest.mark.skipif(os.getuid() != 0, reason="only root can chown a directory away")
def test_a_directory_above_that_another_user_owns_is_refused(root: Path) -> None:
    os.chown(root, 4242, -1)
    with pytest.raises(StorageError, match="belongs to uid 4242, neither to this user nor to root"):
        check_directory_chain(root / "state", root=root / "state")


@pytest.mark.parametrize("mode", [0o770, 0o777], ids=["group", "others"])
def test_nothing_is_written_into_a_directory_others_may_write(root: Path, mode: int) -> None:
    directory = root / "state"
    directory.chmod(mode)
    with pytest.raises(StorageError, match="may be written by other users"):
        write_atomic(directory / "runtime.json", b'{"control_token": "secret"}')
    assert list(directory.iterdir()) == [directory / "sub"]  # no file, no temp file
    assert directory.stat().st_mode & 0o777 == mode  # left as it is: evidence, and the user's to fix


def test_a_directory_others_may_only_read_is_tightened_not_refused(root: Path) -> None:
    (root / "state").chmod(0o755)
    assert ensure_private_dir(root / "state") == root / "state"
    assert (root / "state").stat().st_mode & 0o777 == 0o700
    write_atomic(root / "state" / "runtime.json", b"{}")
    assert (root / "state" / "runtime.json").read_bytes() == b"{}"


@pytest.mark.parametrize("failing", ["temp file", "fsync"])
def test_a_write_that_fails_leaves_the_previous_file_and_no_temp_file(
    root: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    target = root / "state" / "sessions.json"
    write_atomic(target, b"previous\n")
    real_open, real_fsync = os.open, os.fsync

    def open_(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None and failing == "temp file":  # the seam: the temp file's open, out of descriptors
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def fsync(fd: int) -> None:
        if failing == "fsync":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match=r"Too many open files|Input/output error"):
        write_atomic(target, b"next\n")
    monkeypatch.undo()
    assert target.read_bytes() == b"previous\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["sessions.json", "sub"]
