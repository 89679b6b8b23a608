"""What the kernel itself refuses a sandboxed connector, set before ``bwrap`` starts (contract §5).

Two holes no bind mount closes, because neither is a file:

* **abstract UNIX sockets** belong to the network namespace: a connector that shares the host's would
  reach an X11 display (``@/tmp/.X11-unix/X0``) or a D-Bus bus (``unix:abstract=...``). Landlock's scope
  ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`` (ABI 6, Linux 6.12) refuses a connection to one made outside the
  domain (``EPERM``); processes inside it (the connector and its children) still reach each other's.
* **kernel keyrings** are not namespaced: the session keyring the daemon inherited (Kerberos tickets, an
  ecryptfs key, whatever your login put there) is readable from any namespace with ``keyctl``. A seccomp
  filter, built by libseccomp (``libseccomp.so.2``, which systemd itself needs), answers ``keyctl``,
  ``add_key`` and ``request_key`` with ``EPERM``, as Docker's default profile and Flatpak's do.

The sandbox runs ``python -I -S launcher.py [--scope] [--keyrings] -- bwrap ...``: this file restricts
itself as asked, then execs ``bwrap``; both restrictions follow it into the sandbox (inherited across fork
and exec, never lifted). It is a script, standard library only and no import of sidecar, so it starts at
once. No PyPI library sets Landlock scopes (``landlock`` 1.0.0.dev5 has file rules only), hence the two
Landlock syscalls here; the filter is libseccomp's, called through ``ctypes``. Neither restriction handles
file access nor mounts, so ``bwrap`` still builds its sandbox.

It fails closed: if a restriction asked for cannot be set, it exits 126 and runs nothing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

TYPE_CHECKING = False  # not typing's: importing typing would double this script's start (~10 ms)
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "KEYRINGS",
    "SCOPE",
    "SCOPE_ABI",
    "SCRIPT",
    "abi_version",
    "deny_keyrings",
    "libseccomp",
    "no_new_privs",
    "scope",
]

SCRIPT: Final = os.path.abspath(__file__)
"""This file, as the sandbox runs it."""
SCOPE: Final = "--scope"
"""The flag for Landlock's abstract-socket scope."""
KEYRINGS: Final = "--keyrings"
"""The flag for the seccomp filter that refuses the kernel keyrings."""
SCOPE_ABI: Final = 6
"""The first Landlock ABI with scopes."""

# <linux/landlock.h>; syscall numbers shared by every architecture (asm-generic/unistd.h).
_CREATE_RULESET: Final = 444
_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1 << 0
_SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0
_PR_SET_NO_NEW_PRIVS: Final = 38
# <seccomp.h>
_SCMP_ACT_ALLOW: Final = 0x7FFF0000
_SCMP_ACT_ERRNO: Final = 0x00050000
_KEYRING_CALLS: Final = (b"keyctl", b"add_key", b"request_key")
_EXIT_CANNOT: Final = 126  # as a shell says of a command it found but cannot run


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, disabled, or refused)."""
    if sys.platform != "linux":
        return 0
    found = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(found), 0)


def libseccomp() -> ctypes.CDLL | None:
    """libseccomp, or None where it is not installed (or not Linux)."""
    if sys.platform != "linux":
        return None
    try:
        library = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        return None
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_syscall_resolve_name.restype = ctypes.c_int
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_rule_add.restype = ctypes.c_int
    library.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    library.seccomp_load.restype = ctypes.c_int
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    library.seccomp_release.restype = None
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    return library


def no_new_privs() -> None:
    """What Landlock and seccomp ask of an unprivileged caller before ``scope`` or ``deny_keyrings``
    (``bwrap`` sets it inside anyway)."""
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def scope() -> None:
    """Put this process, and all it starts, in a Landlock domain that reaches no abstract socket made
    outside it. Raises ``OSError`` when the kernel refuses."""
    libc = _libc()
    # struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}: scopes only.
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", 0, 0, _SCOPE_ABSTRACT_UNIX_SOCKET), 24)
    ruleset = int(libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(24), ctypes.c_uint32(0)))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def deny_keyrings() -> None:
    """Load a seccomp filter on this process, and all it starts, that answers the keyring system calls
    with ``EPERM``. Raises ``OSError`` without libseccomp or when the kernel refuses."""
    library = libseccomp()
    if library is None:
        raise OSError(errno.ENOENT, "libseccomp.so.2 is not installed")
    context = library.seccomp_init(_SCMP_ACT_ALLOW)  # allow all but what is added; other arches killed
    if not context:
        raise OSError(errno.ENOMEM, "seccomp_init")
    try:
        for name in _KEYRING_CALLS:
            number = library.seccomp_syscall_resolve_name(name)
            if number < 0:
                raise OSError(errno.EINVAL, f"libseccomp knows no system call {name.decode()}")
            done = library.seccomp_rule_add(context, _SCMP_ACT_ERRNO | errno.EPERM, number, 0)
            if done != 0:
                raise OSError(-done, f"seccomp_rule_add({name.decode()})")
        done = library.seccomp_load(context)
        if done != 0:
            raise OSError(-done, "seccomp_load")
    finally:
        library.seccomp_release(context)


def main(argv: list[str]) -> int:
    asked: list[str] = []
    while argv and argv[0] in (SCOPE, KEYRINGS):
        asked.append(argv.pop(0))
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(f"usage: launcher.py [{SCOPE}] [{KEYRINGS}] -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        if asked:
            no_new_privs()
        if SCOPE in asked:
            scope()
        if KEYRINGS in asked:
            deny_keyrings()
    except OSError as exc:  # SECURITY: fail closed, nothing runs unrestricted
        print(f"sidecar: cannot restrict the connector: {exc}", file=sys.stderr)
        return _EXIT_CANNOT
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - the command as given, no shell: it becomes bwrap
    except OSError as exc:
        print(f"sidecar: cannot run {argv[0]}: {exc}", file=sys.stderr)
    return _EXIT_CANNOT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
