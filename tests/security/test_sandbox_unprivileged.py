"""The sandbox as an ordinary account builds it (issue 22): the suite runs as root, where ``bwrap`` needs
no user namespace; a user's daemon runs ``bwrap`` unprivileged, inside one, under the launcher's
``no_new_privs``, Landlock scope and seccomp filter. Here the exact command line ``Sandbox.confine`` makes
for a connector runs as uid 65534 (``setpriv``), and a probe inside tries what a hostile connector would:
read a key planted in that user's home and a file in sidecar's data, write the home's ``.bashrc`` (it
lands in its own private home), reach a
host listener on an abstract socket, read a key in the session keyring it inherited. Run without the
sandbox, as the same user, the same probe gets them all, so the refusals are the sandbox's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.connectors.manifest.spec import Confinement
from sidecar.connectors.stdio.sandbox import Sandbox, detect
from tests.attackers import KEYCTL, OTHER_UID, as_other_user, needs_other_user, needs_sandbox

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
"""The probe's interpreter: the system's, which uid 65534 can reach (the suite's may live in root's home)."""
pytestmark = [
    pytest.mark.slow,
    needs_other_user(),
    needs_sandbox(),
    pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 in /usr/bin for the probe"),
]

ROOT = Path(__file__).resolve().parents[2]
BOUND = 30.0  # seconds: two Python starts and a sandbox, generous for a loaded machine
SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----unprivileged"
KEY = ("sidecar-test-unprivileged", "a login's ticket")

PROBE = r"""
import ctypes, json, os, socket, sys
home, data_file, abstract, key, keyctl = sys.argv[1:6]

def attempt(action):
    try:
        return "ok: " + str(action())
    except Exception as exc:
        return "error: " + type(exc).__name__

def read(path):
    with open(path) as file:
        return file.read(60)

def write(path):
    with open(path, "a") as file:
        file.write("echo pwned\n")
    return "written"

def connect():
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect("\0" + abstract)
        return "connected"

def session_key():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    found = libc.syscall(int(keyctl), 10, ctypes.c_int(-3), b"user", key.encode(), 0)  # KEYCTL_SEARCH @s
    buffer = ctypes.create_string_buffer(100)
    size = libc.syscall(int(keyctl), 11, ctypes.c_int(found), buffer, 100) if found >= 0 else -1  # READ
    if size < 0:
        raise PermissionError(os.strerror(ctypes.get_errno()))
    return buffer.raw[:size].decode()

print(json.dumps({
    "uid": os.getuid(),
    "ssh": attempt(lambda: read(os.path.join(home, ".ssh", "id_ed25519"))),
    "data": attempt(lambda: read(data_file)),
    "bashrc": attempt(lambda: write(os.path.join(home, ".bashrc"))),
    "abstract": attempt(connect),
    "key": attempt(session_key),
}))
"""

PLANT_AND_RUN = """
import os, sys
sys.path.insert(0, sys.argv[1])
from tests.attackers import plant_session_key
plant_session_key(sys.argv[2], sys.argv[3].encode())
os.execvp(sys.argv[4], sys.argv[4:])
"""


class World:
    """A user's home (uid 65534) holding sidecar's three directories, a secret, and the probe beside it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "home"
        self.dirs = [self.home / ".sidecar" / name for name in ("config", "state", "data")]
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519").write_text(SECRET)
        (self.home / ".bashrc").write_text("# the user's own\n")
        for directory in self.dirs:
            directory.mkdir(parents=True)
        self.data_file = self.dirs[2] / "credentials.key"
        self.data_file.write_text("sidecar's key")
        self.probe = base / "probe.py"
        self.probe.write_text(PROBE)
        self.abstract = f"sidecar-test-unprivileged-{os.getpid()}"

    def give_away(self) -> None:
        """Everything to uid 65534, as the user's own files are theirs."""
        for path in [self.home, *self.home.rglob("*")]:
            os.chown(path, OTHER_UID, OTHER_UID)


@pytest.fixture
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="sidecar-unprivileged-", dir="/tmp"))  # not pytest's: uid 65534 reaches it
    try:
        base.chmod(0o755)
        yield World(base)
    finally:
        shutil.rmtree(base)


def _run_as_user(world: World, argv: list[str], env: dict[str, str]) -> dict[str, object]:
    probe_args = [str(world.home), str(world.data_file), world.abstract, KEY[0], str(KEYCTL)]
    command = [sys.executable, "-c", PLANT_AND_RUN, str(ROOT), *KEY, *as_other_user(*argv, *probe_args)]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("\0" + world.abstract)
        listener.listen()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BOUND, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_as_an_ordinary_user_the_sandbox_holds(world: World) -> None:
    support = detect()
    sandbox = Sandbox(support, hidden=world.dirs, homes=world.dirs[2] / "homes", home=str(world.home))
    env = {"HOME": str(world.home), "PATH": os.environ["PATH"]}
    argv, inner, _ = sandbox.confine(
        "probe",
        Confinement(),
        [str(SYSTEM_PYTHON), str(world.probe)],
        env,
        cwd=None,
        workspace="",
        roots=[],
        network=True,
    )
    world.give_away()
    inside = _run_as_user(world, list(argv), inner)
    assert inside["uid"] == OTHER_UID  # bwrap ran unprivileged, in a user namespace of its own
    assert str(inside["ssh"]).startswith("error"), inside
    assert str(inside["data"]).startswith("error"), inside
    assert (world.home / ".bashrc").read_text() == "# the user's own\n"  # it wrote its own private home's
    assert (world.dirs[2] / "homes" / "probe" / ".bashrc").read_text() == "echo pwned\n", inside
    assert inside["abstract"] == ("error: PermissionError" if support.scoped else "ok: connected"), inside
    assert inside["key"] == ("error: PermissionError" if support.keyrings_refused else f"ok: {KEY[1]}"), inside


def test_the_same_probe_unsandboxed_as_that_user_gets_everything(world: World) -> None:
    world.give_away()
    env = {"HOME": str(world.home), "PATH": os.environ["PATH"]}
    outside = _run_as_user(world, [str(SYSTEM_PYTHON), str(world.probe)], env)
    assert outside == {
        "uid": OTHER_UID,
        "ssh": f"ok: {SECRET}",
        "data": "ok: sidecar's key",
        "bashrc": "ok: written",
        "abstract": "ok: connected",
        "key": f"ok: {KEY[1]}",
    }
