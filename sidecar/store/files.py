"""All disk writes go through here: atomic, private, and checked on the open descriptor.

Write: open the directory (``O_NOFOLLOW``) and check it on its descriptor (a plain directory of ours that
group and others may not write), then, relative to that descriptor: temp file (``O_EXCL | O_NOFOLLOW``,
0600) → write → fsync → rename over the target → fsync the directory. A reader sees the old file or the
new one, never a torn one, and nothing is written into a directory someone else could change.
Read: ``O_NOFOLLOW`` open, then ``fstat`` the descriptor: a symlink, a file owned by someone else, or a
file that group/others may write is refused (``StorageError``) rather than trusted.

``check_directory_chain`` checks a directory's whole path: a file is only as safe as every directory
above it, since whoever may rename an entry anywhere on the path may swap the file's directory for one of
theirs (issue 11 item 4).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from sidecar.errors import StorageError
from sidecar.text import preview

__all__ = [
    "StrictJsonError",
    "append_line",
    "check_directory_chain",
    "ensure_private_dir",
    "loads_strict",
    "open_append",
    "open_private",
    "read_json",
    "read_private",
    "remove_quietly",
    "write_atomic",
    "write_json",
]

_DIR_MODE = 0o700
_FILE_MODE = 0o600


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) as 0700 if missing; refuse a symlink, someone else's directory, or one
    that group or others may write (``StorageError`` naming the remedy).

    Our own directory that others may only read or enter (e.g. made 0755 by an older tool) is tightened to
    0700. One they may write is not: files in it may have been swapped already, so it is refused as it is,
    and the user decides (``chmod go-w``) rather than sidecar hiding the evidence.
    """
    path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    info = os.lstat(path)
    _check_private_directory(info, path)
    if info.st_mode & 0o077:
        os.chmod(path, _DIR_MODE)
    return path


def _check_private_directory(info: os.stat_result, path: Path) -> None:
    """A plain directory of ours that group and others may not write; else ``StorageError``."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StorageError(f"{path} is not a plain directory")
    if info.st_uid != os.getuid():
        raise StorageError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o022:
        # SECURITY: another user could rename or replace what sidecar keeps here (an older approvals.json,
        # a stale temp file, runtime.json).
        raise StorageError(
            f"{path} may be written by other users (mode {stat.S_IMODE(info.st_mode):o}); fix: chmod go-w {path}"
        )


def check_directory_chain(directory: Path, *, root: Path | None = None) -> None:
    """Refuse (``StorageError``, naming the first unsafe directory and why) a ``directory`` whose whole path
    is not safe to take trust from or to keep a secret in.

    From ``directory`` up to ``root`` (sidecar's own directories; default ``directory`` alone), each must be
    a plain directory of this user's that group and others may not write. Above ``root`` up to ``/`` (the
    user's home, ``/home``, ``/``) each must belong to this user or to root, and may be writable by others
    only with the sticky bit (``/tmp``: others cannot rename what is not theirs there). Both the path as
    written and its resolved form are walked, so a symbolic link on the way counts by where it lives and by
    where it points. A directory that does not exist yet holds nothing, and is skipped.
    """
    directory = Path(os.path.abspath(directory))
    top = Path(os.path.abspath(root)) if root is not None else directory
    if directory != top and top not in directory.parents:
        top = directory
    own = [directory, *[p for p in directory.parents if top in p.parents or p == top]]
    for path in own:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        _check_private_directory(info, path)
    above = dict.fromkeys([*top.parents, *Path(os.path.realpath(top)).parents])
    me = os.getuid()
    for path in above:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if info.st_uid not in (me, 0):
            raise StorageError(f"{path} belongs to uid {info.st_uid}, neither to this user nor to root")
        if stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise StorageError(
                f"{path} may be written by other users (mode {stat.S_IMODE(info.st_mode):o}) and is above "
                f"{top}; fix: chmod go-w {path}, or keep sidecar's files elsewhere (SIDECAR_HOME)"
            )


def _check_descriptor(fd: int, path: Path) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise StorageError(f"{path} is not a regular file")
    if info.st_uid != os.getuid():
        raise StorageError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o022:
        raise StorageError(f"{path} may be written by other users (mode {stat.S_IMODE(info.st_mode):o})")
    return info


@contextlib.contextmanager
def open_private(path: Path) -> Iterator[BinaryIO]:
    """Open a file we own for reading (streaming); ``FileNotFoundError`` passes through, unsafe raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise StorageError(f"{path}: cannot open safely ({exc.strerror})") from exc
    try:
        _check_descriptor(fd, path)  # before fdopen: a directory would make fdopen raise and leak fd
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def read_private(path: Path, *, max_bytes: int = 16 * 1024 * 1024) -> bytes:
    """Read a whole file we own (``open_private``), refusing one larger than ``max_bytes``."""
    with open_private(path) as handle:
        if os.fstat(handle.fileno()).st_size > max_bytes:
            raise StorageError(f"{path} is larger than {max_bytes} bytes")
        return handle.read(max_bytes + 1)


def write_atomic(path: Path, data: bytes, *, mode: int = _FILE_MODE, private_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; the file is created ``mode`` (0600 by default).

    ``private_dir=False`` is for files that live in someone else's directory layout (a systemd unit
    in ``~/.config/systemd/user``): the directory is created if missing but its mode is left alone.
    """
    if private_dir:
        directory = ensure_private_dir(path.parent)
    else:
        directory = path.parent
        directory.mkdir(parents=True, exist_ok=True)
    # Everything below is relative to this descriptor: the directory checked is the one written into,
    # even if someone renames a directory on the path meanwhile.
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if private_dir else 0)
    try:
        dir_fd = os.open(directory, dir_flags)
    except OSError as exc:
        raise StorageError(f"{directory}: cannot open safely ({exc.strerror})") from exc
    try:
        if private_dir:
            _check_private_directory(os.fstat(dir_fd), directory)
        tmp = f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)  # umask must not loosen it
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, value: Any) -> None:
    """``write_atomic`` of pretty, deterministic JSON."""
    write_atomic(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


class StrictJsonError(ValueError):
    """What ``loads_strict`` refuses beyond ``json.loads``.

    ``str()`` names the offending member for a file the user wrote (``duplicate key 'tools'``);
    ``kind`` says what is wrong without quoting anything, for answers to a request.
    """

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def loads_strict(raw: bytes | str) -> Any:
    """JSON as every body and every security-relevant file must be: no NaN/Infinity (spelled so or as a
    number too large for a float, such as ``1e400``), no duplicate member names in any object, bounded depth.

    ``json.loads`` keeps the last of duplicate keys (a second ``"method"`` or ``"command"`` would
    silently win, so what a check read and what runs could differ) and raises ``RecursionError`` on deep
    nesting. Here both raise ``ValueError``: ``json.JSONDecodeError`` for text that is not JSON, and
    ``StrictJsonError`` for the rest. Member names are compared exactly: ``"Method"`` is another member.
    """
    try:
        return json.loads(
            raw, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_no_duplicates
        )
    except RecursionError:
        raise StrictJsonError("it is nested too deeply", "nested too deeply") from None


def _reject_constant(name: str) -> Any:
    raise StrictJsonError("NaN and Infinity are not JSON", f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # json.loads turns 1e400 into inf, which no JSON writer can write back
        raise StrictJsonError("a number is too large", f"{text[:40]} is too large a number")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):  # the common case costs one dict build and one comparison
        raise StrictJsonError("an object names the same member twice", f"duplicate key {preview(_repeated(pairs), 80)}")
    return result


def _repeated(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return ""


def read_json(path: Path) -> Any:
    """``read_private`` + ``loads_strict``; a parse failure is a ``StorageError`` naming the file."""
    raw = read_private(path)
    try:
        return loads_strict(raw)
    except ValueError as exc:
        raise StorageError(f"{path}: not valid JSON ({exc})") from exc


def open_append(path: Path) -> int:
    """Open (creating 0600) a private append-only file and return its descriptor, checked once."""
    ensure_private_dir(path.parent)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, _FILE_MODE)
    except OSError as exc:
        raise StorageError(f"{path}: cannot open safely ({exc.strerror})") from exc
    try:
        _check_descriptor(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append_line(path: Path, line: bytes, *, fsync: bool = False) -> None:
    """Append one line to a private append-only file (created 0600); checks the descriptor each time."""
    fd = open_append(path)
    try:
        os.write(fd, line if line.endswith(b"\n") else line + b"\n")
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
