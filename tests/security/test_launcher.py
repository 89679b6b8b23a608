"""The launcher that runs ``bwrap`` (issue 22): what runs under it reaches no abstract UNIX socket made
outside it (an X11 display's, a D-Bus bus's) and no kernel keyring, while what it starts still reaches
its own sockets; it fails closed.

Run directly, as the sandbox runs it (``python -I -S launcher.py --scope --keyrings -- COMMAND``), beside
the same command without it, so each refusal is the launcher's doing. ``tests/security/test_sandbox.py``
tries the same from a hostile connector inside its sandbox."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sidecar.connectors.stdio import launcher
from tests.attackers import KEYCTL

LAUNCHER = [sys.executable, "-I", "-S", launcher.SCRIPT]
BOUND = 20.0  # seconds: a Python start and one system call, generous for a loaded machine

needs_scope = pytest.mark.skipif(
    launcher.abi_version() < launcher.SCOPE_ABI,
    reason=f"this kernel's Landlock cannot scope abstract sockets (ABI {launcher.abi_version()})",
)
if launcher.libseccomp() is None and os.environ.get("CI") == "true":
    raise RuntimeError("CI must run the seccomp tests: libseccomp.so.2 is not installed (scripts/test installs it)")
needs_seccomp = pytest.mark.skipif(launcher.libseccomp() is None, reason="libseccomp.so.2 is not installed")

CONNECT = """
import socket, sys
with socket.socket(socket.AF_UNIX) as sock:
    sock.settimeout(5)
    try:
        sock.connect("\\0" + sys.argv[1])
        print("ok")
    except OSError as exc:
        print("error", type(exc).__name__)
"""

OWN = """
import socket, os
name = "\\0sidecar-test-own-%d" % os.getpid()
with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
    server.bind(name)
    server.listen()
    client.connect(name)
    print("ok")
"""

SESSION_KEYRING = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = libc.syscall(int(sys.argv[1]), 0, ctypes.c_int(-3), 0)  # KEYCTL_GET_KEYRING_ID of @s
print("ok" if found >= 0 else "error " + os.strerror(ctypes.get_errno()))
"""


@pytest.fixture
def display() -> Iterator[str]:
    """A host listener on an abstract socket, as an X11 server's ``@/tmp/.X11-unix/X0`` (a connection is
    queued on its backlog: connecting succeeds without an accept)."""
    name = f"sidecar-test-display-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + name)
        server.listen()
        yield name


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=BOUND, check=False)


@pytest.mark.slow
@needs_scope
def test_scoped_the_hosts_abstract_socket_is_refused_and_without_it_reached(display: str) -> None:
    scoped = _run([*LAUNCHER, launcher.SCOPE, "--", sys.executable, "-c", CONNECT, display])
    assert (scoped.returncode, scoped.stdout.strip()) == (0, "error PermissionError"), scoped.stderr
    plain = _run([sys.executable, "-c", CONNECT, display])
    assert plain.stdout.strip() == "ok", plain.stderr


@pytest.mark.slow
@needs_scope
def test_scoped_a_program_still_reaches_its_own_abstract_sockets() -> None:
    done = _run([*LAUNCHER, launcher.SCOPE, "--", sys.executable, "-c", OWN])
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


@pytest.mark.slow
@needs_seccomp
def test_the_keyrings_are_refused_under_the_filter_and_reached_without_it() -> None:
    filtered = _run([*LAUNCHER, launcher.KEYRINGS, "--", sys.executable, "-c", SESSION_KEYRING, str(KEYCTL)])
    assert (filtered.returncode, filtered.stdout.strip()) == (0, "error Operation not permitted"), filtered.stderr
    plain = _run([sys.executable, "-c", SESSION_KEYRING, str(KEYCTL)])
    assert plain.stdout.strip() == "ok", plain.stderr


@pytest.mark.slow
@needs_scope
def test_the_launcher_runs_nothing_it_cannot_and_says_why() -> None:
    missing = _run([*LAUNCHER, launcher.SCOPE, "--", "/nonexistent/sidecar-no-such-program"])
    assert missing.returncode == 126
    assert "cannot run /nonexistent/sidecar-no-such-program" in missing.stderr
    empty = _run(LAUNCHER)
    assert empty.returncode == 2 and "usage" in empty.stderr


@pytest.mark.parametrize("step", ["scope", "deny_keyrings"])
def test_when_the_kernel_refuses_a_restriction_nothing_runs(
    step: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[list[str]] = []

    def refuse() -> None:
        raise OSError(1, step)

    monkeypatch.setattr(launcher, "no_new_privs", lambda: None)  # not on the test process
    monkeypatch.setattr(launcher, "scope", lambda: None)
    monkeypatch.setattr(launcher, "deny_keyrings", lambda: None)
    monkeypatch.setattr(launcher, step, refuse)
    monkeypatch.setattr(launcher.os, "execvp", lambda _file, argv: ran.append(argv))
    assert launcher.main([launcher.SCOPE, launcher.KEYRINGS, "--", "true"]) == 126
    assert ran == []
    assert "cannot restrict the connector" in capsys.readouterr().err
