"""``sidecar service install|uninstall``: run the daemon under the user's service manager (contract §2).

Linux: a systemd ``--user`` unit at ``~/.config/systemd/user/sidecar.service``. macOS: a launchd agent at
``~/Library/LaunchAgents/dev.sidecar.daemon.plist``. The file is written atomically; the service manager
is then driven best-effort — a missing ``systemctl``/``launchctl`` or a failing command becomes a warning
with the command to run by hand, never an exception, so the file is still useful on a machine without a
running user manager (containers, SSH sessions without lingering).

Rendering is pure (``render_systemd_unit``, ``render_launchd_plist``) so tests can check it exactly.
"""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sidecar.errors import ConfigError
from sidecar.store.files import ensure_private_dir, remove_quietly, write_atomic
from sidecar.tuning import PYTHON_FLAGS

__all__ = [
    "LAUNCHD_LABEL",
    "SYSTEMD_UNIT",
    "ServiceResult",
    "install",
    "render_launchd_plist",
    "render_systemd_unit",
    "serve_argv",
    "uninstall",
]

SYSTEMD_UNIT: Final = "sidecar.service"
LAUNCHD_LABEL: Final = "dev.sidecar.daemon"
_COMMAND_TIMEOUT: Final = 30.0  # seconds per systemctl/launchctl call; `enable --now` waits for the start
_UNIT_MODE: Final = 0o644  # a unit holds no secret; service managers read it as the user anyway

Runner = Callable[[list[str]], int]

# Characters that never need quoting in an ExecStart word. Anything else (space, quotes, backslash,
# `$` variable expansion, `%` specifiers, `;` command separator, control characters) is quoted.
_SYSTEMD_SAFE: Final = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_C_ESCAPES: Final = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


@dataclass(slots=True)
class ServiceResult:
    """What ``install``/``uninstall`` did: the unit file, the commands run, and what went wrong."""

    path: Path
    ran: list[list[str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    manager_failed: bool = False
    """The service manager was missing or refused a command: the file is there, the service is not."""


# --- rendering ----------------------------------------------------------------------------------------


def _systemd_escape(text: str) -> str:
    """C-style escapes inside a double-quoted word, then ``%`` → ``%%`` (specifiers expand everywhere)."""
    out = []
    for char in text:
        if char in _C_ESCAPES:
            out.append(_C_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        elif char == "%":
            out.append("%%")
        else:
            out.append(char)
    return "".join(out)


def _systemd_word(arg: str) -> str:
    """One ``ExecStart=`` argument, quoted when needed (systemd.service(5), "Command lines")."""
    if "\0" in arg:
        raise ConfigError("service command arguments may not contain NUL")
    if _SYSTEMD_SAFE.fullmatch(arg):
        return arg
    # `$` is the one character escaped differently: `$$` is the literal (C escapes do not cover it).
    return '"' + _systemd_escape(arg).replace("$", "$$") + '"'


def _check_argv(exec_argv: Sequence[str]) -> None:
    if not exec_argv:
        raise ConfigError("service command is empty")
    if not os.path.isabs(exec_argv[0]):
        raise ConfigError(f"service executable must be an absolute path, not {exec_argv[0]!r}")


def _check_env(env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"environment variable name {name!r} is not valid for a service")
        if "\0" in value:
            raise ConfigError(f"environment variable {name} contains NUL")


def render_systemd_unit(*, exec_argv: list[str], env: dict[str, str]) -> str:
    """The ``sidecar.service`` user unit that runs ``exec_argv`` with ``env``.

    ``ExecStart`` words are quoted by systemd's rules; ``Environment=`` assignments are double-quoted with
    ``%`` doubled (no ``$`` expansion happens there). ``PrivateTmp`` is deliberately absent: it would hide
    the user's own ``/tmp`` (workspaces, sockets) from the tools the daemon runs.
    """
    _check_argv(exec_argv)
    _check_env(env)
    lines = [
        "[Unit]",
        "Description=sidecar: one safe MCP endpoint for the local AI agents",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_systemd_word(arg) for arg in exec_argv),
        "Restart=on-failure",
        "RestartSec=2",
        *(f'Environment="{_systemd_escape(f"{name}={value}")}"' for name, value in sorted(env.items())),
        # SECURITY: the daemon writes tokens and keys; no file it creates should start group/world-readable.
        "UMask=0077",
        "NoNewPrivileges=yes",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def render_launchd_plist(*, label: str, exec_argv: list[str], env: dict[str, str], log_path: Path) -> str:
    """The launchd agent: started at login, restarted when it exits with an error (not after a clean stop)."""
    _check_argv(exec_argv)
    _check_env(env)
    plist: dict[str, object] = {
        "Label": label,
        "ProgramArguments": list(exec_argv),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "EnvironmentVariables": dict(sorted(env.items())),
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
        "ProcessType": "Background",
        # SECURITY: as UMask= in the systemd unit — nothing the daemon creates starts readable by others.
        "Umask": 0o077,
    }
    return plistlib.dumps(plist).decode("utf-8")


# --- install / uninstall ------------------------------------------------------------------------------


def _run_subprocess(argv: list[str]) -> int:
    """Run a service-manager command: argv list, no shell, bounded; its messages go to our stderr."""
    completed = subprocess.run(  # noqa: S603 - fixed argv built here, no shell
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=_COMMAND_TIMEOUT, check=False
    )
    return completed.returncode


def _run_all(
    commands: list[list[str]], run: Runner, result: ServiceResult, *, may_fail: Sequence[list[str]] = ()
) -> bool:
    """Run ``commands`` in order, stopping at the first failure, which becomes a warning naming what to run
    by hand. Commands in ``may_fail`` fail in normal use (unloading an agent that is not loaded) and are
    passed over silently. ``False`` when the tool itself is missing.
    """
    for index, argv in enumerate(commands):
        result.ran.append(argv)
        try:
            status = run(argv)
        except FileNotFoundError:
            result.warnings.append(f"{argv[0]} not found; run by hand: " + _commands_text(commands[index:]))
            result.manager_failed = True
            return False
        except (OSError, subprocess.SubprocessError) as exc:
            status, reason = -1, f"failed ({exc.__class__.__name__}: {exc})"
        else:
            reason = f"exited with status {status}"
        if status != 0 and argv not in may_fail:
            result.manager_failed = True
            result.warnings.append(f"`{shlex.join(argv)}` {reason}")
            if commands[index + 1 :]:
                result.warnings.append("not run: " + _commands_text(commands[index + 1 :]))
            return True
    return True


def _commands_text(commands: list[list[str]]) -> str:
    return "; ".join(shlex.join(argv) for argv in commands)


def _target(platform: str, home: Path) -> Path:
    if platform.startswith("linux"):
        return home / ".config" / "systemd" / "user" / SYSTEMD_UNIT
    if platform == "darwin":
        return home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    raise ConfigError(
        f"`sidecar service` supports Linux (systemd --user) and macOS (launchd), not {platform!r}; "
        "run `sidecar serve` under your own service manager instead"
    )


def serve_argv(python: str = sys.executable) -> list[str]:
    """The command that runs the daemon: ``python -OO -m sidecar serve``."""
    return [python, *PYTHON_FLAGS, "-m", "sidecar", "serve"]


def _default_env() -> dict[str, str]:
    home = os.environ.get("SIDECAR_HOME")
    return {"SIDECAR_HOME": str(Path(home).expanduser().absolute())} if home else {}


def install(
    *,
    platform: str = sys.platform,
    home: Path | None = None,
    exec_argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    run: Runner | None = None,
) -> ServiceResult:
    """Write the unit for this platform and start it (best-effort); reinstalling replaces and restarts.

    ``exec_argv`` defaults to ``serve_argv()``; ``env`` to ``SIDECAR_HOME``
    when it is set. Raises ``ConfigError`` on an unsupported platform or a bad command/environment.
    """
    home = Path.home() if home is None else home
    path = _target(platform, home)
    exec_argv = serve_argv() if exec_argv is None else exec_argv
    env = _default_env() if env is None else env
    run = _run_subprocess if run is None else run
    replacing = path.exists()
    result = ServiceResult(path=path)
    if path.name == SYSTEMD_UNIT:
        body = render_systemd_unit(exec_argv=exec_argv, env=env)
        write_atomic(path, body.encode("utf-8"), mode=_UNIT_MODE, private_dir=False)
        commands = [["systemctl", "--user", "daemon-reload"]]
        if replacing:  # a running service keeps its old command line until restarted
            commands.append(["systemctl", "--user", "try-restart", SYSTEMD_UNIT])
        commands.append(["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT])
        _run_all(commands, run, result)
    else:
        log_dir = ensure_private_dir(home / "Library" / "Logs" / "sidecar")
        body = render_launchd_plist(label=LAUNCHD_LABEL, exec_argv=exec_argv, env=env, log_path=log_dir / "daemon.log")
        write_atomic(path, body.encode("utf-8"), mode=_UNIT_MODE, private_dir=False)
        unload = ["launchctl", "unload", str(path)]
        # `load` refuses an agent already loaded; unloading one that is not loaded fails harmlessly.
        commands = [unload] if replacing else []
        commands.append(["launchctl", "load", "-w", str(path)])
        _run_all(commands, run, result, may_fail=[unload])
    return result


def uninstall(
    *,
    platform: str = sys.platform,
    home: Path | None = None,
    run: Runner | None = None,
) -> ServiceResult:
    """Stop and disable the service (best-effort) and remove its file. Nothing installed is not an error."""
    home = Path.home() if home is None else home
    path = _target(platform, home)
    run = _run_subprocess if run is None else run
    result = ServiceResult(path=path)
    if not path.exists():
        result.warnings.append(f"{path} does not exist; nothing to uninstall")
        return result
    if path.name == SYSTEMD_UNIT:
        available = _run_all([["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]], run, result)
        remove_quietly(path)
        if available:  # forget the removed unit now rather than at the next reload
            _run_all([["systemctl", "--user", "daemon-reload"]], run, result)
    else:
        _run_all([["launchctl", "unload", "-w", str(path)]], run, result)
        remove_quietly(path)
    return result
