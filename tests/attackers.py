"""Attackers the threat model names, as real processes: another OS account on the same machine.

``as_other_user`` runs a command as uid/gid 65534 (``nobody``) with ``setpriv``, which needs root: the
suite runs as root in CI, so there these tests must run; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["OTHER_UID", "as_other_user", "needs_other_user"]

OTHER_UID = 65534


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
