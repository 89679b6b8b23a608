"""Workspace files: an MCP server over stdio that reads and writes files inside one directory.

This is sidecar's reference connector package (see ``connectors/README.md``). sidecar spawns it once per
agent session with ``SIDECAR_PROJECT_DIR`` set to the session's workspace; every tool is confined to that
directory. The file is self-contained on purpose: it runs as a subprocess and imports only the MCP SDK
(and pydantic, which the SDK brings).

Confinement (the contract the tests hold):

* A path is relative to the workspace root; an absolute path is accepted only if it lies inside the root.
  A NUL byte is refused.
* The path is resolved with ``realpath`` and must stay inside the root's ``realpath``: ``..`` past the
  root, absolute paths elsewhere and symbolic links (to files or directories, anywhere in the path) that
  lead outside are refused.
* Reads follow symbolic links that stay inside the workspace. Writes and moves never go through a
  symbolic link, even one that stays inside: a path whose resolution involves a link is refused, so a
  write always changes the file it names.
* The resolved path is then opened component by component from a descriptor of the root, with
  ``O_NOFOLLOW`` at every step (``O_DIRECTORY`` for directories). A link swapped in after the check makes
  the open fail instead of escaping. Directory walks (recursive listing, search) never follow links.
* Errors are tool errors with short messages. They quote the caller's own path, never a resolved path
  outside the workspace, and never carry a traceback.

Exit codes: 0 after the client closes stdin; 2 if ``SIDECAR_PROJECT_DIR`` is unset or not a directory.
POSIX only (Linux, macOS): the confinement rests on ``O_NOFOLLOW`` and ``dir_fd``.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import fnmatch
import functools
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Annotated, Final, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ContentBlock, TextContent, ToolAnnotations
from pydantic import Field

__all__ = ["Workspace", "build_server", "main"]

ROOT_ENV: Final = "SIDECAR_PROJECT_DIR"
EXIT_USAGE: Final = 2  # the conventional "bad invocation" code; sidecar reports it as a start failure

MAX_READ_BYTES: Final = 1024 * 1024  # one read_file call; bigger files are read in pieces with offset
DEFAULT_READ_BYTES: Final = 256 * 1024
SNIFF_BYTES: Final = 8192  # a NUL byte in the first 8 KiB marks a file as binary (as git and grep do)
MAX_WRITE_BYTES: Final = 16 * 1024 * 1024  # a tool call's content travels in one JSON-RPC message
MAX_LIST_ENTRIES: Final = 10_000
MAX_SEARCH_RESULTS: Final = 1000
MAX_SEARCH_FILE_BYTES: Final = 2 * 1024 * 1024  # larger files are skipped, not searched in part
MAX_SEARCH_FILES: Final = 20_000  # files opened by one search
MAX_SEARCH_SECONDS: Final = 20.0  # wall clock of one search, checked between files
MAX_LINE_CHARS: Final = 300  # of a matching line shown in a search result
MAX_DEPTH: Final = 64  # directory levels below the starting point of a walk (bounds open descriptors)
MAX_SHOWN_PATH: Final = 200  # characters of a caller's path quoted in an error
SKIPPED_DIRS: Final = frozenset({".git", ".hg", ".svn"})  # VCS internals, skipped by recursive walks

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading must not hang the server; it is refused after fstat instead.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# Errors where a hard link cannot be made, so a no-clobber rename falls back to check-then-rename.
_NO_HARDLINKS: Final = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _shown(path: str) -> str:
    """The caller's path for an error message: quoted, bounded."""
    return repr(path if len(path) <= MAX_SHOWN_PATH else path[:MAX_SHOWN_PATH] + "…")


def _reason(exc: OSError) -> str:
    """A short reason for an OS error, without the file names the exception may carry."""
    match exc.errno:
        case errno.ENOENT:
            return "not found"
        case errno.ELOOP:
            return "is (or passes through) a symbolic link"
        case errno.ENOTDIR:
            return "a component of the path is not a directory"
        case errno.EISDIR:
            return "is a directory"
        case errno.EEXIST | errno.ENOTEMPTY:
            return "already exists"
        case errno.EACCES | errno.EPERM:
            return "permission denied"
        case errno.EXDEV:
            return "cannot move across file systems"
        case errno.EINVAL:
            return "invalid operation (moving a directory into itself?)"
        case errno.ENAMETOOLONG:
            return "name too long"
        case None:
            return "operating system error"
        case code:
            return os.strerror(code).lower()


def _tool_errors(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn a stray ``OSError`` into a short tool error (the SDK would only say "Error executing tool")."""

    @functools.wraps(fn)  # keeps the signature and annotations the SDK builds the input schema from
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise ToolError(_reason(exc)) from None

    return wrapper


@dataclass(frozen=True)
class _Entry:
    """One directory entry met by a walk; ``dir_fd`` is valid only until the walk moves on."""

    rel: str
    name: str
    kind: str  # "dir", "file", "link" or "other"
    dir_fd: int


def _kind(entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return "file"
    except OSError:
        pass
    return "other"


def _join(rel: str, name: str) -> str:
    return name if rel in ("", ".") else f"{rel}/{name}"


def _matches(pattern: str, entry: _Entry) -> bool:
    # A pattern with a slash matches the workspace-relative path; otherwise the name, as find -name does.
    return fnmatch.fnmatchcase(entry.rel if "/" in pattern else entry.name, pattern)


class Workspace:
    """File operations confined to one root directory (see the module docstring for the rules)."""

    def __init__(self, root: str) -> None:
        self.given_root: Final = os.path.normpath(os.path.abspath(root))
        self.root: Final = os.path.realpath(root)

    # -- resolution -------------------------------------------------------------------------------

    def resolve(self, path: str, *, for_write: bool = False) -> list[str]:
        """The real path's components below the root (``[]`` is the root), or a refusal.

        ``for_write`` also refuses a path whose resolution passes through a symbolic link.
        """
        if "\x00" in path:
            raise ToolError(f"{_shown(path)}: contains a NUL byte")
        path = path or "."
        real = os.path.realpath(os.path.join(self.root, path))
        # SECURITY: containment is decided on the fully resolved path, so "..", absolute paths and links
        # that lead outside are all the same case.
        if os.path.commonpath([self.root, real]) != self.root:
            raise ToolError(f"{_shown(path)}: outside the workspace")
        rel = os.path.relpath(real, self.root)
        if for_write and self._lexical(path) != rel:
            raise ToolError(f"{_shown(path)}: goes through a symbolic link; writes never follow links")
        return [] if rel == "." else rel.split(os.sep)

    def _lexical(self, path: str) -> str | None:
        """The path relative to the root as written (no links resolved), or None if it is not below it."""
        if not os.path.isabs(path):
            return os.path.normpath(path)
        norm = os.path.normpath(path)
        for base in (self.root, self.given_root):
            if os.path.commonpath([base, norm]) == base:
                return os.path.relpath(norm, base)
        return None

    def open_dir(self, parts: list[str], *, create: bool = False) -> int:
        """A descriptor of the directory ``parts`` below the root, opened without following any link;
        with ``create``, missing directories are made on the way."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _parent(self, parts: list[str], path: str, *, create: bool = False) -> Iterator[int]:
        try:
            fd = self.open_dir(parts[:-1], create=create)
        except FileNotFoundError:
            hint = "" if create else " (pass create_dirs=true to create it)"
            raise ToolError(f"{_shown(path)}: parent directory does not exist{hint}") from None
        except OSError as exc:
            raise ToolError(f"{_shown(path)}: {_reason(exc)}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_file(self, parts: list[str], path: str) -> tuple[int, os.stat_result]:
        """A read descriptor of the regular file ``parts``, and its status."""
        if not parts:
            raise ToolError(f"{_shown(path)}: is a directory")
        with self._parent(parts, path) as parent:
            try:
                fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise ToolError(f"{_shown(path)}: {_reason(exc)}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = "is a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
                raise ToolError(f"{_shown(path)}: {kind}")
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    # -- walking ----------------------------------------------------------------------------------

    def walk(self, dir_fd: int, rel: str, *, recursive: bool, depth: int = 0) -> Generator[_Entry, None, None]:
        """Entries below ``dir_fd`` depth-first in name order, never following links or entering VCS dirs."""
        with os.scandir(dir_fd) as it:  # scandir works on a duplicate, so dir_fd stays ours
            entries = sorted(it, key=lambda e: e.name)
        for item in entries:
            entry = _Entry(_join(rel, item.name), item.name, _kind(item), dir_fd)
            yield entry
            if not recursive or entry.kind != "dir" or item.name in SKIPPED_DIRS or depth >= MAX_DEPTH:
                continue
            try:
                child = os.open(item.name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # unreadable, or replaced by a link since scandir: skip it
            try:
                yield from self.walk(child, entry.rel, recursive=True, depth=depth + 1)
            finally:
                os.close(child)

    # -- the tools --------------------------------------------------------------------------------

    def list_files(self, path: str, pattern: str, recursive: bool, limit: int) -> str:
        parts = self.resolve(path)
        try:
            fd = self.open_dir(parts)
        except OSError as exc:
            reason = "not a directory" if exc.errno == errno.ENOTDIR else _reason(exc)
            raise ToolError(f"{_shown(path)}: {reason}") from None
        lines: list[str] = []
        truncated = False
        try:
            with contextlib.closing(self.walk(fd, "/".join(parts), recursive=recursive)) as entries:
                for entry in entries:
                    if not _matches(pattern, entry):
                        continue
                    if len(lines) == limit:
                        truncated = True
                        break
                    lines.append(entry.rel + {"dir": "/", "link": "@"}.get(entry.kind, ""))
        finally:
            os.close(fd)
        if not lines:
            return "(no matching entries)"
        if truncated:
            lines.append(f"[listing stopped at {limit} entries; narrow the path or pattern]")
        return "\n".join(lines)

    def read_file(self, path: str, offset: int, max_bytes: int) -> CallToolResult:
        parts = self.resolve(path)
        fd, info = self._open_file(parts, path)
        try:
            size = info.st_size
            if offset > size:
                raise ToolError(f"{_shown(path)}: offset {offset} is past the end of the file ({size} bytes)")
            if b"\x00" in os.pread(fd, SNIFF_BYTES, 0):
                raise ToolError(f"{_shown(path)}: binary file ({size} bytes); read_file returns text only")
            data = _pread_all(fd, max_bytes, offset)
        finally:
            os.close(fd)
        if b"\x00" in data:
            raise ToolError(f"{_shown(path)}: binary file ({size} bytes); read_file returns text only")
        truncated = offset + len(data) < size
        text, used, lossy = _decode(data, final=not truncated)
        end = offset + used
        content: list[ContentBlock] = [TextContent(type="text", text=text)]
        notes = []
        if lossy:
            notes.append("the file is not valid UTF-8; undecodable bytes are shown as U+FFFD")
        if truncated:
            notes.append(f"truncated: bytes {offset}-{end} of {size}; call read_file with offset={end} for more")
        if notes:
            content.append(TextContent(type="text", text="\n".join(f"[{note}]" for note in notes)))
        return CallToolResult(content=content)

    def search_files(self, query: str, path: str, glob: str, limit: int, regex: bool) -> str:
        found = _matcher(query, regex=regex)
        parts = self.resolve(path)
        hits: list[str] = []
        skipped = {"binary": 0, "large": 0}
        stop: str | None = None
        deadline = time.monotonic() + MAX_SEARCH_SECONDS
        opened = 0
        for entry in self._search_targets(parts, path):
            if entry.kind != "file" or not _matches(glob, entry):
                continue
            if opened == MAX_SEARCH_FILES:
                stop = f"search stopped after {MAX_SEARCH_FILES} files; narrow the path or glob"
                break
            opened += 1
            text = self._searchable(entry, skipped)
            if text is not None and not _grep(text, entry.rel, found, hits, limit):
                stop = f"stopped at {limit} matches; narrow the query, path or glob"
            elif time.monotonic() > deadline:
                stop = f"search stopped after {MAX_SEARCH_SECONDS:.0f} s; narrow the path or glob"
            if stop is not None:
                break
        notes = [stop] if stop else []
        if skipped["binary"] or skipped["large"]:
            notes.append(
                f"skipped {skipped['binary']} binary file(s) and {skipped['large']} file(s) over "
                f"{MAX_SEARCH_FILE_BYTES // (1024 * 1024)} MiB"
            )
        lines = hits or ["(no matches)"]
        return "\n".join(lines + [f"[{note}]" for note in notes])

    def _search_targets(self, parts: list[str], path: str) -> Generator[_Entry, None, None]:
        """The entries a search looks at: one file, or everything below a directory."""
        try:
            fd = self.open_dir(parts)
        except NotADirectoryError:
            with self._parent(parts, path) as parent:
                yield _Entry("/".join(parts), parts[-1], "file", parent)
            return
        except OSError as exc:
            raise ToolError(f"{_shown(path)}: {_reason(exc)}") from None
        try:
            with contextlib.closing(self.walk(fd, "/".join(parts), recursive=True)) as entries:
                yield from entries
        finally:
            os.close(fd)

    @staticmethod
    def _searchable(entry: _Entry, skipped: dict[str, int]) -> str | None:
        """The text of a small regular text file, or None (counted in ``skipped`` when binary or large)."""
        try:
            fd = os.open(entry.name, _READ_FLAGS, dir_fd=entry.dir_fd)
        except OSError:
            return None  # gone, unreadable, or a link swapped in: not searched
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            if info.st_size > MAX_SEARCH_FILE_BYTES:
                skipped["large"] += 1
                return None
            data = _pread_all(fd, MAX_SEARCH_FILE_BYTES + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) > MAX_SEARCH_FILE_BYTES:
            skipped["large"] += 1
            return None
        if b"\x00" in data[:SNIFF_BYTES]:
            skipped["binary"] += 1
            return None
        return data.decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str, create_dirs: bool, overwrite: bool) -> str:
        data = content.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content is {len(data)} bytes; write_file takes at most {MAX_WRITE_BYTES}")
        parts = self.resolve(path, for_write=True)
        if not parts:
            raise ToolError(f"{_shown(path)}: is the workspace root")
        name = parts[-1]
        with self._parent(parts, path, create=create_dirs) as parent:
            existing = _lstat(name, parent)
            if existing is not None:
                if stat.S_ISLNK(existing.st_mode):
                    raise ToolError(f"{_shown(path)}: is a symbolic link; writes never follow links")
                if not stat.S_ISREG(existing.st_mode):
                    raise ToolError(f"{_shown(path)}: exists and is not a regular file")
                if not overwrite:
                    raise ToolError(f"{_shown(path)}: already exists (pass overwrite=true to replace it)")
            temp = _write_temp(parent, name, data, mode=None if existing is None else stat.S_IMODE(existing.st_mode))
            try:
                _place(parent, temp, parent, name, overwrite=overwrite, is_dir=False)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=parent)
                raise
            with contextlib.suppress(OSError):
                os.fsync(parent)  # the rename itself survives a crash
        verb = "replaced" if existing is not None else "created"
        return f"{verb} {'/'.join(parts)} ({len(data)} bytes)"

    def move_file(self, source: str, destination: str, overwrite: bool) -> str:
        src = self.resolve(source, for_write=True)
        dst = self.resolve(destination, for_write=True)
        if not src:
            raise ToolError(f"{_shown(source)}: is the workspace root")
        if not dst:
            raise ToolError(f"{_shown(destination)}: is the workspace root")
        if src == dst:
            raise ToolError("source and destination are the same path")
        with self._parent(src, source) as src_parent, self._parent(dst, destination) as dst_parent:
            moving = _lstat(src[-1], src_parent)
            if moving is None:
                raise ToolError(f"{_shown(source)}: not found")
            if stat.S_ISLNK(moving.st_mode):
                raise ToolError(f"{_shown(source)}: is a symbolic link; moves never follow links")
            target = _lstat(dst[-1], dst_parent)
            if target is not None:
                if not overwrite:
                    raise ToolError(f"{_shown(destination)}: already exists (pass overwrite=true to replace it)")
                if stat.S_ISDIR(target.st_mode) or stat.S_ISDIR(moving.st_mode):
                    raise ToolError(f"{_shown(destination)}: already exists; directories are never replaced")
            try:
                _place(
                    src_parent, src[-1], dst_parent, dst[-1], overwrite=overwrite, is_dir=stat.S_ISDIR(moving.st_mode)
                )
            except OSError as exc:
                raise ToolError(f"cannot move {_shown(source)} to {_shown(destination)}: {_reason(exc)}") from None
        return f"moved {'/'.join(src)} to {'/'.join(dst)}"


def _matcher(query: str, *, regex: bool) -> Callable[[str], bool]:
    if not regex:
        return lambda line: query in line
    try:
        compiled = re.compile(query)
    except re.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from None
    return lambda line: compiled.search(line) is not None


def _grep(text: str, rel: str, found: Callable[[str], bool], hits: list[str], limit: int) -> bool:
    """Append ``rel:line:text`` for each matching line; False once a match is found beyond ``limit``."""
    for number, line in enumerate(text.split("\n"), start=1):
        if not found(line):
            continue
        if len(hits) == limit:
            return False
        shown = line.rstrip("\r")
        shown = shown if len(shown) <= MAX_LINE_CHARS else shown[:MAX_LINE_CHARS] + "…"
        hits.append(f"{rel}:{number}:{shown}")
    return True


def _pread_all(fd: int, count: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while count > 0:
        chunk = os.pread(fd, count, offset)
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _decode(data: bytes, *, final: bool) -> tuple[str, int, bool]:
    """(text, bytes used, lossy). When not final, an incomplete UTF-8 sequence at the end is left for
    the next read, so that ``offset + used`` is where the next piece starts."""
    for errors, lossy in (("strict", False), ("replace", True)):
        decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
        try:
            text = decoder.decode(data, final=final)
        except UnicodeDecodeError:
            continue
        pending = decoder.getstate()[0]
        return text, len(data) - len(pending), lossy
    raise AssertionError("unreachable: errors='replace' does not raise")


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_temp(dir_fd: int, name: str, data: bytes, *, mode: int | None) -> str:
    """Write ``data`` to a new temporary file next to ``name``; fsync it; return its name."""
    temp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
    # 0o666 minus the umask, as any new file; an existing file's mode is kept (below).
    fd = os.open(temp, _TEMP_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    os.close(fd)
    return temp


def _place(src_dir: int, src: str, dst_dir: int, dst: str, *, overwrite: bool, is_dir: bool) -> None:
    """Rename ``src`` to ``dst``; without ``overwrite``, never replace a file that appeared meanwhile."""
    if overwrite:
        os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    if not is_dir:
        # link() fails with EEXIST instead of replacing: an atomic no-clobber rename for files.
        try:
            os.link(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in _NO_HARDLINKS:
                raise
        else:
            os.unlink(src, dir_fd=src_dir)
            return
    # Directories (and file systems without hard links): checked just before, so only a racing writer
    # can be overwritten here.
    if _lstat(dst, dst_dir) is not None:
        raise FileExistsError(errno.EEXIST, "exists")
    os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)


# -- the MCP server -------------------------------------------------------------------------------

_PathArg = Annotated[str, Field(description="Path relative to the workspace root (an absolute path must be inside it)")]
_READ_ONLY: Final = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def build_server(workspace: Workspace) -> MCPServer:
    """The MCP server exposing ``workspace``'s five tools."""
    server: MCPServer = MCPServer(
        name="workspace",
        version="0.1.0",
        instructions=(
            "Files of the current project. Paths are relative to the workspace root; nothing outside it "
            "can be read or written, and writes never go through symbolic links."
        ),
        log_level="WARNING",  # stderr is the daemon's log; refused paths are the agent's business
    )

    @server.tool(annotations=_READ_ONLY, structured_output=False)
    @_tool_errors
    def list_files(
        path: _PathArg = ".",
        pattern: Annotated[str, Field(description="fnmatch pattern on names, or on paths if it has a '/'")] = "*",
        recursive: bool = False,
        limit: Annotated[int, Field(ge=1, le=MAX_LIST_ENTRIES)] = 500,
    ) -> str:
        """List a directory of the workspace, one workspace-relative path per line, sorted by name.

        Directories end with "/", symbolic links with "@". Recursive listings do not enter symbolic links
        or .git/.hg/.svn.
        """
        return workspace.list_files(path, pattern, recursive, limit)

    @server.tool(annotations=_READ_ONLY, structured_output=False)
    @_tool_errors
    def read_file(
        path: _PathArg,
        offset: Annotated[int, Field(ge=0, description="Byte offset to start at")] = 0,
        max_bytes: Annotated[int, Field(ge=1, le=MAX_READ_BYTES)] = DEFAULT_READ_BYTES,
    ) -> CallToolResult:
        """Read a text file (UTF-8). Binary files are refused.

        If the file does not fit, a second content block says so and gives the offset to continue from.
        """
        return workspace.read_file(path, offset, max_bytes)

    @server.tool(annotations=_READ_ONLY, structured_output=False)
    @_tool_errors
    def search_files(
        query: Annotated[str, Field(min_length=1, description="Text to find (a Python regex if regex=true)")],
        path: _PathArg = ".",
        glob: Annotated[str, Field(description="fnmatch pattern on file names, or on paths if it has a '/'")] = "*",
        limit: Annotated[int, Field(ge=1, le=MAX_SEARCH_RESULTS)] = 100,
        regex: bool = False,
    ) -> str:
        """Search text files like grep; one "path:line:text" per match.

        Skips binary files, files over 2 MiB, symbolic links and .git/.hg/.svn; bounded in matches, files
        and time.
        """
        return workspace.search_files(query, path, glob, limit, regex)

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True),
        structured_output=False,
    )
    @_tool_errors
    def write_file(path: _PathArg, content: str, create_dirs: bool = False, overwrite: bool = True) -> str:
        """Write a UTF-8 text file atomically (a temporary file in the same directory, then a rename).

        An existing file keeps its permissions. Refuses symbolic links and, with overwrite=false, an
        existing file.
        """
        return workspace.write_file(path, content, create_dirs, overwrite)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True), structured_output=False)
    @_tool_errors
    def move_file(source: _PathArg, destination: _PathArg, overwrite: bool = False) -> str:
        """Move or rename a file or directory inside the workspace.

        The destination's parent must exist. An existing destination is refused unless overwrite=true, and
        a directory is never replaced.
        """
        return workspace.move_file(source, destination, overwrite)

    return server


def main() -> int:
    """Check ``SIDECAR_PROJECT_DIR`` and serve MCP on stdin/stdout until the client closes stdin."""
    root = os.environ.get(ROOT_ENV, "")
    if not root:
        print(
            f"workspace connector: {ROOT_ENV} is not set (sidecar sets it to the session's workspace)", file=sys.stderr
        )
        return EXIT_USAGE
    if root.startswith("${"):
        print(f"workspace connector: {ROOT_ENV} is an unexpanded placeholder: {root}", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isdir(root):
        print(f"workspace connector: {ROOT_ENV}={root!r} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    build_server(Workspace(root)).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
