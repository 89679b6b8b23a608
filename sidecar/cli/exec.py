"""``sidecar exec [session options] -- CMD ARGS…``: run an agent with a session of its own.

The session is created for the current directory (its workspace, and its name as the project unless
``--project`` says otherwise); the agent gets the connection in its environment, under the names
connectors' ``mcp.json`` placeholders use, so a host config can refer to them instead of holding
secrets:

- ``SIDECAR_LOCAL_MCP_ORIGIN`` — the daemon's origin (``http://127.0.0.1:<port>``);
- ``SIDECAR_LOCAL_MCP_AUTHORIZATION`` — ``Bearer <route token>``;
- ``SIDECAR_MCP_CONTEXT`` — the session envelope;
- ``SIDECAR_MCP_URL`` — the full endpoint URL (``…/mcp``, or ``…/mcp/connectors/<id>`` with ``--connector``).

The agent runs without a shell, in this process's process group, so a terminal's Ctrl-C reaches it
directly; signals sent to ``sidecar exec`` alone (a service manager's SIGTERM, ``kill``) are passed on.
Its exit code is ours (128 + N when a signal N ended it), and the session ends when it exits, however
it exits. The session names this process and the agent as its owners (``auth.owners``): should
``sidecar exec`` be killed outright (SIGKILL runs none of its code) or stopped (an agent can SIGSTOP its
parent, then exit), the daemon ends the session when either process is gone. The agent is named before
it runs a single instruction of its own: it starts held on a pipe, and is let go only once the daemon
knows its pid, so it cannot stop ``sidecar exec`` in between.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final
from urllib.parse import urlsplit

from sidecar.cli.options import add_session_options, session_body
from sidecar.errors import SidecarError
from sidecar.paths import Paths

__all__ = ["add_exec_command", "agent_environment", "cmd_exec"]

FORWARDED: Final = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
"""Signals passed on to the agent. SIGINT too, unless the terminal already sent it to the agent."""
_PROJECT_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._:/@-]+")


def add_exec_command(sub: Any) -> None:
    """Register ``sidecar exec`` on the top-level subparsers."""
    parser = sub.add_parser(
        "exec",
        help="run an agent with a session of its own in its environment",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.set_defaults(handler=cmd_exec)
    parser.add_argument("--project", help="the session's project (default: the current directory's name)")
    add_session_options(parser, label_default="the command's name, e.g. claude")
    parser.add_argument("agent", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the agent to run")


def agent_environment(created: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """``base`` plus the session's connection, from a ``POST /control/sessions`` answer."""
    url = str(created["url"])
    parts = urlsplit(url)
    headers = created["headers"]
    return {
        **base,
        "SIDECAR_LOCAL_MCP_ORIGIN": f"{parts.scheme}://{parts.netloc}",
        "SIDECAR_LOCAL_MCP_AUTHORIZATION": str(headers["Authorization"]),
        "SIDECAR_MCP_CONTEXT": str(headers["X-Sidecar-Context"]),
        "SIDECAR_MCP_URL": url,
    }


def cmd_exec(args: argparse.Namespace, paths: Paths) -> int:
    from sidecar.cli.client import ControlClient

    command = list(args.agent)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SidecarError("give the agent to run after --, e.g. sidecar exec -- claude")
    client = ControlClient(paths)
    body = _session_body(args)
    body.setdefault("label", Path(command[0]).name[:80])
    created = client.call("POST", "/control/sessions", body)
    session_id = str(created["session_id"])

    def name_agent(pid: int) -> None:
        client.call("PATCH", f"/control/sessions/{session_id}", {"agent_pid": pid})

    try:
        return _run(command, agent_environment(created, dict(os.environ)), name_agent)
    finally:
        # A new client: the daemon may have restarted meanwhile (same port, new control token); the session
        # outlived that. Already ended (by the user, or its owner watch) or no daemon: nothing to do.
        with contextlib.suppress(SidecarError):
            ControlClient(paths).call("DELETE", f"/control/sessions/{session_id}")


def _session_body(args: argparse.Namespace) -> dict[str, Any]:
    workspace = Path.cwd().absolute()
    body = session_body(args, workspace=str(workspace), project=args.project or _project_of(workspace))
    body["owner_pid"] = os.getpid()  # the session ends with us, even if we are SIGKILLed
    return body


_HOLD: Final = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "if os.read(fd, 1) != b'g':\n"
    "    sys.exit(126)\n"
    "os.close(fd)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""What the agent's process runs until it is let go: wait for the byte, then become the agent."""


def _project_of(workspace: Path) -> str:
    name = _PROJECT_UNSAFE.sub("-", workspace.name).strip("-._:/@")[:128]
    return name or "default"


def _run(command: Sequence[str], env: dict[str, str], name_agent: Callable[[int], None]) -> int:
    """Run the agent to its end; ``name_agent(pid)`` is called while it is held, before it runs."""
    if shutil.which(command[0], path=env.get("PATH", os.defpath)) is None:
        raise SidecarError(f"cannot run {command[0]!r}: no such program")
    go_read, go_write = os.pipe()
    try:
        # The agent starts as a small holder that waits for one byte on the pipe, then execs the agent
        # (same pid, same environment): nothing of the agent's own runs until we say so.
        holder = [sys.executable, "-I", "-S", "-c", _HOLD, str(go_read), *command]
        agent = subprocess.Popen(holder, env=env, pass_fds=(go_read,))  # noqa: S603 - argv, never a shell
    except OSError as exc:
        os.close(go_write)
        raise SidecarError(f"cannot run {command[0]!r}: {exc.strerror}") from None
    finally:
        os.close(go_read)
    try:
        name_agent(agent.pid)
    except BaseException:
        os.close(go_write)  # the holder reads EOF and exits without running the agent
        agent.wait()
        raise
    os.write(go_write, b"g")
    os.close(go_write)
    with _forwarding(agent):
        while True:
            try:
                code = agent.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - SIGINT is handled below; belt and braces
                continue
    return 128 - code if code < 0 else code


@contextlib.contextmanager
def _forwarding(agent: subprocess.Popen[bytes]) -> Iterator[None]:
    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_sent_it_too():
            return  # the terminal signalled the whole foreground group: the agent has it already
        with contextlib.suppress(ProcessLookupError):
            agent.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, *FORWARDED)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _terminal_sent_it_too() -> bool:
    """True when we are in the foreground process group of our terminal (so is the agent)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):
        return False
