"""Process lifecycle: one daemon per home, bind 127.0.0.1, write runtime.json, stop gracefully.

The state directory must be safe along its whole path (``check_directory_chain``: ours, private, and no
directory above it that another user may change): the daemon writes its control token there, so it
refuses to start otherwise, saying which directory and how to fix it. An unsafe config directory does not
stop it: the trust store refuses to take trust while it lasts, and ``sidecar status`` says why.

Single instance: an exclusive ``flock`` on ``<state>/daemon.lock`` is held for the daemon's life. A
second daemon cannot take it and refuses to start, naming the first; when the holder dies the kernel
releases the lock, so a stale ``runtime.json`` (dead pid) is simply replaced.

``runtime.json`` (0600) is written only after the socket listens, and removed on stop. SIGINT and
SIGTERM (or ``POST /control/stop``) stop the daemon: routes are revoked (in-flight requests abort),
then the server closes, all within ``shutdown_timeout`` seconds.

``sidecar serve`` (``dedicated=True``) makes the daemon the child subreaper of its connectors' trees
(``connectors.stdio.orphans``): whatever a connector double-forks is adopted, reaped, and killed with its
connector, and nothing it adopted outlives the stop. A process that merely hosts ``serve()`` (the test
runner) is not made one: it has other children, whose orphans and exit statuses are not the daemon's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from aiohttp import web

from sidecar import __version__, tuning
from sidecar.app import build_app
from sidecar.appkeys import FRONT_DOOR, Runtime
from sidecar.auth.encoding import mint_token, token_digest
from sidecar.bus.registry import ToolRegistry
from sidecar.config import LOOPBACK_HOST, Settings
from sidecar.connectors.stdio.orphans import ORPHANAGE
from sidecar.errors import Conflict, StorageError
from sidecar.http import JsonErrorRunner
from sidecar.paths import Paths
from sidecar.store.files import check_directory_chain, ensure_private_dir, remove_quietly, write_json
from sidecar.store.runtime import read_runtime
from sidecar.system import port_holders
from sidecar.text import preview

__all__ = ["serve"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _single_instance(paths: Paths) -> Iterator[IO[bytes]]:
    ensure_private_dir(paths.state)
    # SECURITY: runtime.json (the control token) goes here; never into a directory others may change.
    check_directory_chain(paths.state)
    fd = os.open(paths.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(fd, "r+b")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = read_runtime(paths)
            where = f" (pid {running['pid']}, {running['url']})" if running else ""
            raise Conflict(f"a sidecar daemon is already running for {paths.state.parent}{where}") from None
        yield handle
    finally:
        handle.close()


def _ensure_directory(path: Path) -> None:
    """Create one of the user's own directories (0700) if missing; one that is unsafe is reported, left as
    it is (evidence), and refused by whatever reads trust or writes a file there."""
    try:
        ensure_private_dir(path)
    except StorageError as exc:
        logger.warning("%s; sidecar takes no trust from it and writes nothing there until it is fixed", exc)


async def _run(
    runner: web.AppRunner,
    settings: Settings,
    paths: Paths,
    runtime: Runtime,
    control_token: str,
    *,
    ready: asyncio.Event | None,
    dedicated: bool,
) -> None:
    """Listen, write runtime.json, wait for the stop, then clean up (bounded)."""
    await runner.setup()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, LOOPBACK_HOST, settings.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise Conflict(port_taken(settings.port, paths)) from None
        runtime.port = _listening_port(runner)
        url = f"http://{LOOPBACK_HOST}:{runtime.port}"
        # Handlers first: once runtime.json exists, a service manager may signal us at any moment.
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, runtime.request_stop)
        write_json(
            paths.runtime_file,
            {
                "pid": runtime.pid,
                "url": url,
                "port": runtime.port,
                "control_token": control_token,
                "started_at": runtime.started_at,
                "version": __version__,
            },
        )
        logger.info("sidecar %s ready: listening on %s/mcp (stop it with Ctrl-C or sidecar stop)", __version__, url)
        tuning.settle(dedicated=dedicated)
        if ready is not None:
            ready.set()
        await runtime.stop_event.wait()
        logger.info("stopping")
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        remove_quietly(paths.runtime_file)
        started = time.monotonic()
        try:
            await asyncio.wait_for(runner.cleanup(), settings.shutdown_timeout + 5)
        except TimeoutError:
            logger.warning("shutdown took longer than %.0fs; exiting anyway", settings.shutdown_timeout + 5)
        logger.info("stopped in %.2fs", time.monotonic() - started)


def port_taken(port: int, paths: Paths) -> str:
    """Why the daemon cannot listen on ``port``: which process holds it (from ``/proc`` where we may
    look), and how to pick another port."""
    holders = port_holders(port)
    named = [f"pid {h.pid} ({preview(h.command, 160)})" for h in holders if h.pid is not None]
    others = sorted({h.uid for h in holders if h.pid is None})
    if not named and others:
        named = [f"a process of uid {uid} (not ours to inspect)" for uid in others]
    who = ", ".join(named) if named else f"another process (find it with: ss -ltnp 'sport = :{port}')"
    return (
        f"port {port} on {LOOPBACK_HOST} is in use by {who}; stop it, or give sidecar another port: "
        f"sidecar serve --port N, or port = N in {paths.settings_file} (every configured host then needs "
        "the new URL; --port 0 takes any free port)"
    )


def _listening_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) == 2:  # (host, port): the IPv4 socket
            return int(address[1])
    raise RuntimeError(f"no listening IPv4 socket among {runner.addresses}")


async def serve(
    settings: Settings,
    paths: Paths,
    *,
    registry: ToolRegistry | None = None,
    ready: asyncio.Event | None = None,
    dedicated: bool = False,
) -> int:
    """Run the daemon until a signal or a stop request; return the exit code.

    ``dedicated``: this process exists to be the daemon (``sidecar serve``), so it is tuned for that once
    start-up is done (``sidecar.tuning``).
    """
    with _single_instance(paths):
        for directory in (paths.config, paths.data):
            _ensure_directory(directory)
        if dedicated:
            # Before anything is spawned. Only here: a subreaper is process-wide (connectors.stdio.orphans).
            ORPHANAGE.activate()
            # Before the daemon listens; process-wide as well, so never in a process that merely hosts it.
            tuning.raise_open_files_limit()
        control_token = mint_token()
        runtime = Runtime(control_token=control_token, control_digest=token_digest(control_token))
        app = build_app(settings, paths, runtime, registry=registry)
        limits = settings.limits

        def admit(transport: asyncio.BaseTransport) -> Callable[[], None] | None:
            return app[FRONT_DOOR].admit(transport)  # the front door exists once the runner is set up

        runner = JsonErrorRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=settings.shutdown_timeout,
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            max_headers=limits.max_headers,
            keepalive_timeout=limits.keepalive_timeout,
            head_timeout=limits.head_read_timeout,
            admit=admit,  # SECURITY: another account's connection is reset before a byte is read
        )
        # The sweeps reap what the daemon adopted while it runs; at the end (after every connector
        # stopped) whatever it adopted and still runs is killed.
        async with ORPHANAGE.sweeping():
            await _run(runner, settings, paths, runtime, control_token, ready=ready, dedicated=dedicated)
    return 0
