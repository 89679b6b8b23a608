"""Attackers the threat model names, as real processes: another OS account on the same machine, and (with
``tests/connectors/fixtures/hostile.py``) a hostile connector, which ``needs_sandbox`` tests confine.

``as_other_user`` runs a command as uid/gid 65534 (``nobody``) with ``setpriv``, which needs root: the
suite runs as root in CI, so there these tests must run; elsewhere they are skipped with the reason.
``watching_command_lines`` is that account polling every process's command line, which ``/proc`` shows
to every user.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import platform
import shutil
import sys
from collections.abc import AsyncIterator

import pytest

from sidecar.connectors.stdio.sandbox import detect

__all__ = [
    "KEYCTL",
    "OTHER_UID",
    "as_other_user",
    "needs_other_user",
    "needs_sandbox",
    "plant_session_key",
    "watching_command_lines",
]

OTHER_UID = 65534
KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine(), -1)
"""keyctl(2)'s system call number here (no Python binding for the kernel keyrings in the standard library)."""
_ADD_KEY = {"x86_64": 248, "aarch64": 217}.get(platform.machine(), -1)
_KEYCTL_JOIN_SESSION_KEYRING, _SESSION_KEYRING = 1, -3


def _why_not() -> str | None:
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if os.geteuid() != 0:
        return "running a process as another uid needs root"
    return None


def needs_other_user() -> pytest.MarkDecorator:
    """Skip where another uid cannot be had, except in CI, where the attacker tests must run."""
    why = _why_not()
    if why is not None and os.environ.get("CI") == "true":
        raise RuntimeError(f"CI must run the other-uid attacks: {why}")
    return pytest.mark.skipif(why is not None, reason=why or "")


def as_other_user(*argv: str) -> list[str]:
    """``argv`` run as uid and gid 65534 with no supplementary groups."""
    return ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv]


_WATCHER = r"""
import json, os, sys, threading
seen, done = set(), threading.Event()

def processes():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    born = f.read().rpartition(b")")[2].split()[19]
                yield (pid, born), f"/proc/{pid}/cmdline"
            except (OSError, IndexError):
                pass

before = {key for key, _ in processes()}
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
print("watching", flush=True)
while not done.is_set():
    for key, cmdline in processes():
        if key not in before:
            try:
                with open(cmdline, "rb") as f:
                    seen.add(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
print(json.dumps(sorted(seen)), flush=True)
"""
"""Only processes born while it watches: whatever ran before (a CI runner's own script, say) is not the
test's, and may quote anything."""


@contextlib.asynccontextmanager
async def watching_command_lines(bound: float = 30.0) -> AsyncIterator[list[str]]:
    """Another account (uid 65534) polls ``/proc/*/cmdline`` without pause while the block runs; the list
    yielded holds every distinct command line of a process started meanwhile, once the block has ended."""
    proc = await asyncio.create_subprocess_exec(
        *as_other_user(sys.executable, "-c", _WATCHER),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    seen: list[str] = []
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), bound) == b"watching\n"
        yield seen
    finally:
        proc.stdin.close()
        try:
            out = await asyncio.wait_for(proc.stdout.read(), bound)
            await asyncio.wait_for(proc.wait(), bound)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    seen.extend(json.loads(out))


def needs_sandbox() -> pytest.MarkDecorator:
    """Skip where connectors cannot be sandboxed (no bwrap, no user namespaces), except in CI, where the
    sandbox tests must run (``scripts/test`` installs bubblewrap)."""
    support = detect()
    if not support.available and os.environ.get("CI") == "true":
        raise RuntimeError(f"CI must run the sandbox tests: {support.reason}")
    return pytest.mark.skipif(not support.available, reason=support.reason)


def plant_session_key(description: str, payload: bytes) -> None:
    """Put a ``user`` key in a new, anonymous session keyring of this process, which every process it starts
    then inherits, as a login's Kerberos ticket or ecryptfs key would be (``keyctl new_session; keyctl add``).
    A new keyring, so the account's own is untouched; it goes when the last process holding it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "keyctl(JOIN_SESSION_KEYRING)")
    key = libc.syscall(_ADD_KEY, b"user", description.encode(), payload, len(payload), ctypes.c_int(_SESSION_KEYRING))
    if key < 0:
        raise OSError(ctypes.get_errno(), "add_key")
