"""Every stdio connector in an OS sandbox: bubblewrap (``bwrap``, Flatpak's sandbox), run as a program.

A sandboxed connector sees (contract §5):

* the system read-only: ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``, ``/opt``; its own files
  read-only: its package or plugin directory, its command's installation (a venv and the Python it was
  made from, a Node install), the project of a script named on its command line (its outermost
  ``node_modules``, or the directory with its ``package.json`` or ``pyproject.toml``), and its own ``cwd``;
* a private ``/tmp``, ``/dev`` and ``/proc`` (its own PID namespace: no other process, so no
  ``/proc/<daemon>/environ``), and a private ``$HOME`` kept per connector under ``<data>/homes/<id>`` (so
  ``npx``/``uvx`` caches and a server's own state survive a restart);
* what it declares (``Confinement``): the session's workspace read-only or read-write, more read or
  write paths; and the network only when it needs it (a connector that works offline gets its own
  network namespace: a loopback of its own, none of the host's listeners, no name resolution; one that
  shares the host's is kept from its abstract UNIX sockets by Landlock, ``launcher.py``, where the kernel can).

It never sees sidecar's config, state or data directories (masked even inside a path it may see), the
user's real home (``~/.ssh``, ``~/.aws``, the keyrings, shell rc files), ``/run`` (the D-Bus session bus,
display sockets) nor ``$SSH_AUTH_SOCK``, nor (where the kernel allows, ``launcher.py``) the host's abstract
sockets and the kernel keyrings. A declared path that is ``/`` or holds the home, or lies in
sidecar's directories, is refused: the connector does not start, and says why.

``detect`` runs ``bwrap`` once with the namespaces used here, and once more under ``launcher.py``: it
says whether there is a sandbox and, if not, why (not Linux, no bwrap, user namespaces refused), and
whether the kernel also keeps abstract sockets and keyrings out of reach. Where there is none, a
connector runs as before, shown as unsandboxed, unless it declared ``"required": true``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sidecar.connectors.manifest.spec import Confinement
from sidecar.connectors.stdio import launcher as kernel
from sidecar.errors import ToolError
from sidecar.paths import Paths

__all__ = [
    "HOMES",
    "SYSTEM_DIRS",
    "Sandbox",
    "SandboxRefused",
    "Support",
    "daemon_sandbox",
    "detect",
    "sandbox_argv",
]

logger = logging.getLogger(__name__)

SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
"""Shown read-only to every connector: what any program needs to run (a merged-/usr link stays a link)."""
HOMES: Final = "homes"
"""Under the daemon's data directory: each connector's private, persistent ``$HOME``."""
_NAMESPACES: Final = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")
_PROBE_TIMEOUT: Final = 10.0
_PRIVATE_TMP: Final = "/tmp"  # noqa: S108 - a tmpfs of the sandbox's own, nobody else's


class SandboxRefused(ToolError):
    """A connector that cannot start as it is declared: it requires a sandbox there is not, or it
    declares a path the sandbox never shows."""


@dataclass(frozen=True, slots=True)
class Support:
    """Whether connectors can be sandboxed here, and what says so (a version) or why not."""

    available: bool
    reason: str
    program: str | None = None
    launcher: tuple[str, ...] = ()
    """What runs ``bwrap`` with the kernel's own restrictions (``launcher.py``); empty where there are none."""

    @property
    def scoped(self) -> bool:
        """Whether the host's abstract sockets are out of reach (else a connector with the network reaches
        them: an X11 display, a D-Bus bus)."""
        return kernel.SCOPE in self.launcher

    @property
    def keyrings_refused(self) -> bool:
        """Whether the kernel keyrings (the daemon's session keyring) are out of reach."""
        return kernel.KEYRINGS in self.launcher

    def as_json(self) -> dict[str, object]:
        return {
            "available": self.available,
            "reason": self.reason,
            "abstract_sockets_scoped": self.scoped,
            "keyrings_refused": self.keyrings_refused,
        }


def detect(program: str = "bwrap") -> Support:
    """Run ``program`` once with every namespace a connector gets (cached per process and program)."""
    return _probe(program)


@functools.cache
def _probe(program: str) -> Support:
    if sys.platform != "linux":
        return Support(False, f"no sandbox on {sys.platform}: connectors run as your account, unconfined")
    found = shutil.which(program)
    if found is None:
        return Support(False, f"bubblewrap ({program}) is not installed: connectors run unconfined")
    argv = [found, "--ro-bind", "/", "/", *_NAMESPACES, "--unshare-net", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--die-with-parent", "--cap-drop", "ALL", "true"]
    flags, said = _restrictions()
    launcher = (sys.executable, "-I", "-S", kernel.SCRIPT, *flags, "--") if flags else ()
    try:
        version = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [found, "--version"], check=False, capture_output=True, text=True, timeout=_PROBE_TIMEOUT
        )
        refused = _refused(launcher, argv) if launcher else None  # bwrap under the launcher: one run
        why = _fails(argv) if refused is not None or not launcher else None  # else bwrap alone
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support(False, f"{found} did not run ({exc}): connectors run unconfined")
    if why is not None:
        return Support(False, f"{found} cannot make a sandbox here ({why}): connectors run unconfined")
    name = version.stdout.strip() or found
    if refused is not None:
        return Support(True, f"{name}; abstract sockets NOT scoped, keyrings NOT refused ({refused})", found)
    return Support(True, f"{name}; {said}", found, launcher)


def _restrictions() -> tuple[list[str], str]:
    """The launcher's flags this kernel and system allow, and what they mean (or why one is missing)."""
    flags: list[str] = []
    abi = kernel.abi_version()
    if abi >= kernel.SCOPE_ABI:
        flags.append(kernel.SCOPE)
        said = [f"abstract sockets scoped (Landlock ABI {abi})"]
    else:
        have = f"Landlock ABI {abi}" if abi else "no Landlock"
        said = [f"abstract sockets NOT scoped ({have}, needs {kernel.SCOPE_ABI})"]
    if kernel.libseccomp() is not None:
        flags.append(kernel.KEYRINGS)
        said.append("keyrings refused (seccomp)")
    else:
        said.append("keyrings NOT refused (no libseccomp.so.2)")
    return flags, "; ".join(said)


def _refused(launcher: tuple[str, ...], argv: list[str]) -> str | None:
    """Why the probe failed under the launcher (where bwrap alone may still work), or None."""
    try:
        return _fails([*launcher, *argv])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)


def _fails(argv: list[str]) -> str | None:
    """Why ``argv`` failed (its last line of stderr), or None if it exited 0."""
    done = subprocess.run(  # noqa: S603 - fixed argv built here, no shell
        argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT, check=False
    )
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class _Mount:
    flag: str  # --ro-bind, --bind, --symlink, --tmpfs
    source: str
    target: str


def sandbox_argv(
    program: str,
    argv: Sequence[str],
    *,
    mounts: Iterable[tuple[str, str, str]],
    masked: Iterable[str],
    cwd: str,
    network: bool,
    launcher: Sequence[str] = (),
) -> list[str]:
    """The ``bwrap`` command line that runs ``argv`` with exactly ``mounts`` ((flag, source, target),
    parents before children so no bind shadows a narrower one, one per target, writable where any of
    them is), ``masked`` directories emptied last, in ``cwd``, with the host's network or a namespace of its own;
    ``bwrap`` itself run by ``launcher`` (``Support.launcher``) when there is one."""
    chosen: dict[str, _Mount] = {}
    for mount in (_Mount(*m) for m in mounts):  # one mount per target: a writable bind beats a read-only one
        held = chosen.get(mount.target)
        if held is None or (held.flag != "--bind" and mount.flag == "--bind"):
            chosen[mount.target] = mount
    ordered = sorted(chosen.values(), key=lambda m: (m.target.count("/"), m.target))
    line = [*launcher, program, "--die-with-parent", *_NAMESPACES, "--cap-drop", "ALL"]
    if not network:
        line.append("--unshare-net")
    line += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", _PRIVATE_TMP]
    for mount in ordered:
        line += [mount.flag, mount.source, mount.target] if mount.flag != "--tmpfs" else [mount.flag, mount.target]
    for directory in sorted(set(masked)):
        line += ["--tmpfs", directory]
    return [*line, "--chdir", cwd, "--", *argv]


class Sandbox:
    """The sandbox every stdio connector of one daemon runs in: ``confine`` wraps a launch in ``bwrap``."""

    def __init__(self, support: Support, *, hidden: Sequence[Path], homes: Path, home: str | None = None) -> None:
        self.support = support
        self._hidden = tuple(os.path.realpath(p) for p in hidden)
        """sidecar's own directories: never shown, masked where a shown path holds them."""
        self._homes = homes
        self._home = os.path.realpath(home or os.path.expanduser("~"))

    def describe(self, connector_id: str, confinement: Confinement, *, network: bool) -> dict[str, object]:
        """What the sandbox lets this connector see, as ``connectors show`` and the console say it."""
        if not confinement.enabled:
            return {"mode": "off", "why": "your mcp.json runs it unsandboxed (sidecarSandbox: false)"}
        if not self.support.available:
            mode = "refused" if confinement.required else "none"
            return {"mode": mode, "why": self.support.reason}
        return {
            "mode": "on",
            "workspace": confinement.workspace,
            "read_paths": list(confinement.read_paths),
            "write_paths": list(confinement.write_paths),
            "network": network,
            "abstract_sockets": "reachable" if network and not self.support.scoped else "none",
            "home": str(self._homes / connector_id),
        }

    def confine(
        self,
        connector_id: str,
        confinement: Confinement,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: str | None,
        workspace: str,
        roots: Sequence[Path],
        network: bool,
    ) -> tuple[tuple[str, ...], dict[str, str], str | None]:
        """(argv, env, cwd) that run the connector in its sandbox; unchanged when it opted out or there is
        no sandbox here (unless it requires one: ``SandboxRefused``)."""
        if not confinement.enabled:
            return tuple(argv), dict(env), cwd
        if not self.support.available or self.support.program is None:
            if confinement.required:
                raise SandboxRefused(
                    f"connector {connector_id} requires a sandbox, and there is none here: {self.support.reason}"
                )
            return tuple(argv), dict(env), cwd
        for path in (*confinement.read_paths, *confinement.write_paths):
            self._check_declared(connector_id, path)
        home = env.get("HOME") or self._home
        private = self._homes / connector_id
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
        mounts: list[tuple[str, str, str]] = [("--bind", str(private), home)]
        mounts += self._system()
        for root in roots:  # its package or plugin directory
            mounts.append(("--ro-bind", str(root), str(root)))
        mounts += self._own_files(argv, env.get("PATH"), workspace, roots)
        inside = cwd
        if workspace and confinement.workspace != "none":
            flag = "--bind" if confinement.workspace == "read-write" else "--ro-bind"
            mounts.append((flag, os.path.realpath(workspace), workspace))
        elif cwd == workspace:
            inside = home  # no workspace shown: it starts in its own home
        if inside and inside not in (home, workspace) and self._shown_automatically(inside, workspace):
            mounts.append(("--ro-bind", os.path.realpath(inside), inside))
        mounts += [("--ro-bind", os.path.realpath(p), p) for p in confinement.read_paths if os.path.exists(p)]
        mounts += [("--bind", os.path.realpath(p), p) for p in confinement.write_paths if os.path.exists(p)]
        never = list(self._hidden)  # masked wherever a shown path holds them
        if workspace and confinement.workspace == "none":
            never.append(os.path.realpath(workspace))  # the workspace only if declared, even inside a project
        masked = [
            target + hidden[len(source.rstrip("/")) :]
            for flag, source, target in mounts
            if flag in ("--bind", "--ro-bind")
            for hidden in never
            if _within(hidden, source) and os.path.isdir(hidden)
        ]
        inner = dict(env)
        inner["HOME"] = home
        if "TMPDIR" in inner:
            inner["TMPDIR"] = _PRIVATE_TMP
        wrapped = sandbox_argv(
            self.support.program,
            argv,
            mounts=mounts,
            masked=masked,
            cwd=inside or home,
            network=network,
            launcher=self.support.launcher,
        )
        return tuple(wrapped), inner, None

    def _check_declared(self, connector_id: str, path: str) -> None:
        """A declared path may hold sidecar's directories (they are masked) but not be ``/`` or your home
        or hold it, nor lie inside sidecar's own files."""
        real = os.path.realpath(path)
        if _within(self._home, real):
            raise SandboxRefused(
                f"connector {connector_id} declares {path} for its sandbox, which would show your whole home "
                f"({self._home}); declare a narrower path"
            )
        if any(_within(real, hidden) for hidden in self._hidden):
            raise SandboxRefused(f"connector {connector_id} declares {path} for its sandbox: it is sidecar's own")

    def _shown_automatically(self, path: str, workspace: str) -> bool:
        """Whether a path the connector's own config names may be shown without a declaration: not the
        workspace or in it (only a declaration shows that), not ``/`` nor your home or a directory holding
        it, not inside sidecar's own files (which are masked where a shown path holds them)."""
        real = os.path.realpath(path)
        if workspace and (_within(real, os.path.realpath(workspace)) or _within(path, workspace)):
            return False
        if _within(self._home, real):
            return False
        return not any(_within(real, hidden) for hidden in self._hidden)

    @staticmethod
    def _system() -> list[tuple[str, str, str]]:
        mounts: list[tuple[str, str, str]] = []
        for directory in SYSTEM_DIRS:
            if os.path.islink(directory):
                mounts.append(("--symlink", os.readlink(directory), directory))
            elif os.path.isdir(directory):
                mounts.append(("--ro-bind", directory, directory))
        resolver = os.path.realpath("/etc/resolv.conf")
        if not _within(resolver, "/etc") and os.path.exists(resolver):  # e.g. systemd-resolved's, under /run
            mounts.append(("--ro-bind", resolver, resolver))
        return mounts

    def _own_files(
        self, argv: Sequence[str], search: str | None, workspace: str, roots: Sequence[Path]
    ) -> list[tuple[str, str, str]]:
        """Read-only: the command's installation (its prefix, e.g. a venv and the Python it was made from)
        and the project of each script named on the command line outside its package's ``roots``
        (``_project_of``), else the script's directory, else the script alone, whichever may be shown
        first (not your home, e.g.)."""
        found: list[tuple[str | None, ...]] = []  # per file: what to show, the widest first
        command = shutil.which(argv[0], path=search) if argv else None
        if command is not None:
            for path in {os.path.abspath(command), os.path.realpath(command)}:
                found.append((os.path.dirname(os.path.dirname(path)),))  # <prefix>/bin/<command>
            if os.path.realpath(command) == os.path.realpath(sys.executable):
                found += [(sys.prefix,), (sys.base_prefix,)]
        for arg in argv[1:]:
            if arg.startswith("/") and os.path.isfile(arg) and not any(_within(arg, str(r)) for r in roots):
                found.append((_project_of(arg), os.path.dirname(arg), arg))
        mounts: list[tuple[str, str, str]] = []
        for candidates in found:
            for candidate in candidates:
                if candidate is None or not os.path.exists(candidate):
                    continue
                if any(_within(candidate, system) for system in SYSTEM_DIRS):
                    break  # shown already
                if self._shown_automatically(candidate, workspace):
                    mounts.append(("--ro-bind", os.path.realpath(candidate), candidate))
                    break
        return mounts


_PROJECT_FILES: Final = ("package.json", "pyproject.toml")


def _project_of(script: str) -> str | None:
    """The project a script belongs to, as its runtime resolves imports: the outermost ``node_modules`` it
    lies in (Node looks for a package's dependencies up that tree, where npm hoists them), else the nearest
    directory above it with a ``package.json`` or ``pyproject.toml``; None if neither."""
    ancestors = Path(script).parents
    for directory in reversed(ancestors):  # from / down: the outermost first
        if directory.name == "node_modules":
            return str(directory)
    for directory in ancestors:
        if any((directory / name).is_file() for name in _PROJECT_FILES):
            return str(directory)
    return None


async def daemon_sandbox(program: str, paths: Paths) -> Sandbox:
    """The daemon's sandbox: ``program`` probed off the event loop, sidecar's three directories hidden,
    private homes under ``data``; a daemon whose connectors cannot be sandboxed says so as it starts."""
    support = await asyncio.to_thread(detect, program)
    if not support.available:
        logger.warning("connectors are NOT sandboxed: %s", support.reason)
    return Sandbox(support, hidden=[paths.config, paths.state, paths.data], homes=paths.data / HOMES)
