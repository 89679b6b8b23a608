"""Debian's Chromium for the tests: its flags, and Chromium as the user's ``$BROWSER``.

Chromium must be ``/usr/bin/chromium`` (``scripts/test`` installs it where it may); without it these
tests skip, except in CI, where they must run (``needs_chromium``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psutil
import pytest

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS", "chromium_as_browser", "needs_chromium"]

CHROMIUM: Final = "/usr/bin/chromium"
CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
_GONE_WAIT: Final = 10.0


def needs_chromium() -> pytest.MarkDecorator:
    """Skip without Chromium, except in CI, where the browser tests must run."""
    missing = shutil.which(CHROMIUM) is None
    if missing and os.environ.get("CI") == "true":
        raise RuntimeError(f"{CHROMIUM} is missing: CI must install Debian's chromium (scripts/test does)")
    return pytest.mark.skipif(missing, reason=f"{CHROMIUM} is not installed (Debian package chromium)")


@contextlib.contextmanager
def chromium_as_browser(scratch: Path) -> Iterator[str]:
    """A ``$BROWSER`` value that opens its one argument in a headless Chromium of its own (in the
    background, as a desktop browser would go on after the command returns); every Chromium it started
    is killed on the way out, and none may be left."""
    profile = scratch / "chromium-profile"
    launcher = scratch / "chromium-browser.sh"
    flags = " ".join(CHROMIUM_FLAGS)
    launcher.write_text(f'#!/bin/sh\n{CHROMIUM} {flags} --user-data-dir={profile} "$1" >/dev/null 2>&1 &\n')
    launcher.chmod(0o755)
    try:
        yield f"{launcher} %s"
    finally:
        started = _started_from(profile)
        for proc in started:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        _, alive = psutil.wait_procs(started, timeout=_GONE_WAIT)
        assert not alive, f"Chromium processes left behind: {alive}"


def _started_from(profile: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(str(profile) in arg for arg in proc.cmdline()):
                found.append(proc)
    return found
