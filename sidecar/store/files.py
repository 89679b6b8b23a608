"""All disk writes go through here: atomic, private, and checked on the open descriptor.

Write: temp file in the same directory (``O_EXCL | O_NOFOLLOW``, 0600) → write → fsync → ``os.replace`` →
fsync the directory. A reader sees the old file or the new one, never a torn one.
Read: ``O_NOFOLLOW`` open, then ``fstat`` the descriptor: a symlink, a file owned by someone else, or a
file that group/others may write is refused (``StorageError``) rather than trusted.
"""

from __future__ import annotations

import contextlib
import json
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
    """Create ``path`` (and parents) as 0700 if missing; refuse a symlink or someone else's directory."""
    path.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StorageError(f"{path} is not a plain directory")
    if info.st_uid != os.getuid():
        raise StorageError(f"{path} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o077:
        # Our own directory with loose bits (e.g. made by an older tool): tighten, do not trust as is.
        os.chmod(path, _DIR_MODE)
    return path


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
    tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # umask must not loosen it
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
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
    """JSON as every body and every security-relevant file must be: no NaN/Infinity, no duplicate
    member names in any object, bounded depth.

    ``json.loads`` keeps the last of duplicate keys (a second ``"method"`` or ``"command"`` would
    silently win, so what a check read and what runs could differ) and raises ``RecursionError`` on deep
    nesting. Here both raise ``ValueError``: ``json.JSONDecodeError`` for text that is not JSON, and
    ``StrictJsonError`` for the rest. Member names are compared exactly: ``"Method"`` is another member.
    """
    try:
        return json.loads(raw, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise StrictJsonError("it is nested too deeply", "nested too deeply") from None


def _reject_constant(name: str) -> Any:
    raise StrictJsonError("NaN and Infinity are not JSON", f"{name} is not JSON")


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
