"""Trust pinned to content: the key an approval is recorded under (contract §5).

``trust_key(spec)`` is ``<id>::<sha256>`` over the canonical launch config and, for packages and plugins,
the digest of every file in the connector's directory. Any change to the command, the args, the env
(keys and values), the cwd, the url, the header *names*, the pre-registered OAuth client (its id, its
secret file's path, its scopes), an offline declaration or a package file changes the key, so an
approval given to one config never carries over to another (the swapped-config attack of Cursor's
CVE-2025-54136).

Env *values* count because they can run code as surely as the command can (``LD_PRELOAD``,
``NODE_OPTIONS``, ``PYTHONPATH``); they enter as a digest each (``env_digests``), as written in the config
(a ``${NAME}`` placeholder, not what it expands to), so a secret is never kept or shown in clear.
Header *values* stay out: they carry the bearer tokens a user rotates, and they run nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Final

from sidecar.canonical import canonical_json
from sidecar.connectors.manifest.sources import ConnectorSpec
from sidecar.errors import ConfigError

__all__ = ["MAX_PACKAGE_BYTES", "MAX_PACKAGE_FILES", "canonical_launch", "package_digest", "trust_key"]

MAX_PACKAGE_FILES: Final = 10_000
MAX_PACKAGE_BYTES: Final = 200 * 1024 * 1024  # 200 MiB: a connector is code, not a data set
_SKIPPED_DIRS: Final = frozenset({"__pycache__", ".git", "node_modules"})
_SKIPPED_SUFFIXES: Final = (".pyc",)
_CHUNK: Final = 1024 * 1024


def canonical_launch(spec: ConnectorSpec) -> bytes:
    """The launch config as canonical JSON: sorted keys, no spaces, env and header names without values.

    A connector that declares it works offline carries ``"offline": true``: the declaration lets sessions
    without the network use it, so making it must need trust again (a package's is in its files anyway).
    Connectors that need the network, the default, hash as they always did. A remote server with a
    pre-registered OAuth client carries ``"oauth"`` (client id, secret file path, scopes; never the
    secret): signing in as another client is another config. Servers without one hash as before. One
    that says ``"process": "shared"`` carries ``"process"``: one process serving every session is a
    decision the user reviews (per-session processes, the default, hash as before). A user's or plugin's
    entry that declares its tools' risk carries ``"tool_risks"``: making a tool LOW lets it run unasked
    (a package's declaration is in its files, digested apart); one that declares billable tools carries
    ``"tool_billing"``: dropping one lets its calls run unasked. One whose sandbox declaration is not the
    default (a workspace, more paths, required, or opted out) carries ``"sandbox"``: what it may see is
    what the user approves.
    """
    launch = spec.launch
    canonical: dict[str, object] = {
        "transport": launch.transport,
        "command": launch.command,
        "args": list(launch.args),
        "env_keys": sorted(launch.env),
        "cwd": launch.cwd,
        "url": launch.url,
        "header_keys": sorted(launch.headers),
    }
    if launch.env:
        # Only where there is an env: a connector without one keeps the key it was trusted under.
        canonical["env_digests"] = {name: _env_digest(name, value) for name, value in sorted(launch.env.items())}
    if not spec.network:
        canonical["offline"] = True
    if spec.process == "shared":
        canonical["process"] = "shared"
    if spec.tool_risks and spec.kind != "package":
        canonical["tool_risks"] = {name: str(risk) for name, risk in sorted(spec.tool_risks.items())}
    if spec.tool_billing:
        canonical["tool_billing"] = {
            name: tool.model_dump(by_alias=True) for name, tool in sorted(spec.tool_billing.items())
        }
    if (sandbox := spec.sandbox.declared()) is not None:
        canonical["sandbox"] = sandbox
    if launch.oauth is not None:
        secret_file = launch.oauth.secret_file
        canonical["oauth"] = {
            "client_id": launch.oauth.client_id,
            "secret_file": str(secret_file) if secret_file is not None else None,
            "scopes": list(launch.oauth.scopes),
        }
        if launch.oauth.metadata_document:
            canonical["oauth"]["metadata_document"] = True  # type: ignore[index]
    return canonical_json(canonical)


def _env_digest(name: str, value: str) -> str:
    """A value as the trust key holds it: SHA-256 over the name and the value, never the value itself."""
    return hashlib.sha256(b"sidecar env value\0" + name.encode() + b"\0" + value.encode()).hexdigest()


def _file_sha256(path: Path, budget: int) -> tuple[str, int]:
    """(hex digest, bytes read) of one regular file, opened without following a link swapped in."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read package file ({exc.strerror})") from exc
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ConfigError(f"{path}: changed into something other than a regular file while hashed")
        while chunk := handle.read(_CHUNK):
            size += len(chunk)
            if size > budget:
                raise ConfigError(f"{path}: the package is larger than {MAX_PACKAGE_BYTES} bytes")
            digest.update(chunk)
    return digest.hexdigest(), size


class _DigestCache:
    """File digests remembered by what ``stat`` says of the file, as git's index does: a file whose
    device, inode, size, mtime and ctime are unchanged is not read again. Every write changes ctime, so
    a changed file is always re-read; a file modified in the last ``_RACY_SECONDS`` is never cached,
    since a second write within the clock's granularity could leave every stamp as it was."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[tuple[str, int, int, int, int, int], tuple[str, int]] = {}

    def digest(self, path: Path, info: os.stat_result, budget: int) -> tuple[str, int]:
        key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        cached = self._entries.get(key)
        if cached is not None and cached[1] <= budget:
            return cached
        found = _file_sha256(path, budget)
        if time.time() - info.st_mtime > _RACY_SECONDS:
            if len(self._entries) >= self._limit:
                del self._entries[next(iter(self._entries))]  # the oldest entry
            self._entries[key] = found
        return found


_RACY_SECONDS: Final = 2.0
_DIGESTS: Final = _DigestCache(limit=4 * MAX_PACKAGE_FILES)


def _record(path: Path, root: Path, info: os.stat_result, budget: int) -> tuple[tuple[str, str, str, bool], int]:
    """(relative path, kind, sha256, executable) of one non-directory entry, and the bytes it read."""
    rel = path.relative_to(root).as_posix()
    if stat.S_ISLNK(info.st_mode):
        target = os.fsencode(os.readlink(path))
        return (rel, "link", hashlib.sha256(target).hexdigest(), False), 0
    if stat.S_ISREG(info.st_mode):
        digest, size = _DIGESTS.digest(path, info, budget)
        return (rel, "file", digest, bool(info.st_mode & 0o111)), size
    raise ConfigError(f"{path}: not a regular file, directory or symlink; remove it from the package")


def package_digest(root: Path) -> str:
    """sha256 over every file under ``root``: sorted (relative posix path, kind, sha256, executable bit).

    Computed at trust time and again before every spawn, so it must be cheap: a file whose ``stat`` is
    unchanged since it was last hashed is not read again (``_DigestCache``). Skips ``__pycache__/``,
    ``.git/``, ``node_modules/`` and ``*.pyc``. A symlink counts as its link text and is never
    followed; a FIFO, socket or device is refused (its content is not fixed). Bounded:
    more than ``MAX_PACKAGE_FILES`` files (or directories) or ``MAX_PACKAGE_BYTES`` raise ``ConfigError``,
    as does anything unreadable. Empty directories do not count.
    """
    records: list[tuple[str, str, str, bool]] = []
    total = 0
    pending = [root]
    directories = 0
    while pending:
        directory = pending.pop()
        directories += 1
        if directories > MAX_PACKAGE_FILES:
            raise ConfigError(f"{root}: the package has more than {MAX_PACKAGE_FILES} directories")
        try:
            with os.scandir(directory) as listing:
                children = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            raise ConfigError(f"{directory}: cannot list package directory ({exc.strerror})") from exc
        for entry in children:
            path = Path(entry.path)
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    if entry.name not in _SKIPPED_DIRS:
                        pending.append(path)
                    continue
                if entry.name.endswith(_SKIPPED_SUFFIXES):
                    continue
                if len(records) >= MAX_PACKAGE_FILES:
                    raise ConfigError(f"{root}: the package has more than {MAX_PACKAGE_FILES} files")
                record, size = _record(path, root, info, MAX_PACKAGE_BYTES - total)
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read package file ({exc.strerror})") from exc
            records.append(record)
            total += size
    records.sort()
    return hashlib.sha256(canonical_json(records)).hexdigest()


def trust_key(spec: ConnectorSpec) -> str:
    """``<id>::<sha256>`` of the canonical launch config, plus the package digest for packages and plugins."""
    digest = hashlib.sha256(canonical_launch(spec))
    if spec.kind in ("package", "plugin") and spec.root is not None:
        digest.update(b"\npackage:" + package_digest(spec.root).encode("ascii"))
    return f"{spec.id}::{digest.hexdigest()}"
