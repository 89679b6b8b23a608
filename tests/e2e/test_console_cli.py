"""``sidecar ui`` as a user runs it: the CLI against a daemon process, the printed link used by a client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.attackers import needs_other_user, watching_command_lines
from tests.browsers import chromium_as_browser, needs_chromium
from tests.conftest import DaemonProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # the daemon and the CLI are processes


def _spend(url: str) -> tuple[int, dict[str, object]]:
    """What the sign-in page's script does with the code in its address's fragment."""
    page, _, fragment = url.partition("#code=")
    origin = page.partition("/ui/")[0]
    request = urllib.request.Request(
        f"{origin}/ui/api/session",
        data=json.dumps({"code": fragment}).encode(),
        headers={"Content-Type": "application/json", "Origin": origin},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_sidecar_ui_prints_a_link_that_signs_in_once(daemon_process: DaemonProcess) -> None:
    result = daemon_process.cli("ui", "--no-browser")
    found = re.search(r"(http://127\.0\.0\.1:\d+/ui/signin#code=[A-Za-z0-9_-]{43})\s", result.stdout)
    assert found is not None, result.stdout
    assert "works once, within 60 s" in result.stdout
    status, answer = _spend(found.group(1))
    assert status == 200 and isinstance(answer["secret"], str)
    status, again = _spend(found.group(1))
    assert status == 403 and "secret" not in again


def test_sidecar_ui_without_a_daemon_says_so(daemon_process: DaemonProcess) -> None:
    daemon_process.cli("stop")
    result = daemon_process.cli("ui", "--no-browser", check=False)
    assert result.returncode == 1 and "no sidecar daemon is running" in result.stderr


def test_sidecar_ui_puts_no_secret_on_the_browsers_command_line(daemon_process: DaemonProcess, tmp_path: Path) -> None:
    # Every user can read a process's command line (/proc/<pid>/cmdline): the browser gets a private
    # file that leads to the link, never the link.
    argv_log = tmp_path / "argv"
    recorder = tmp_path / "browser.sh"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {argv_log}\n')
    recorder.chmod(0o755)
    daemon_process.env["BROWSER"] = f"{recorder} %s"
    result = daemon_process.cli("ui")
    [argument] = argv_log.read_text().splitlines()
    assert argument.startswith("file://"), argument
    page = Path(urlsplit(argument).path)
    info = page.stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.getuid())
    found = re.search(r"location\.replace\((\"[^\"]+\")\)", page.read_text())
    assert found is not None
    url = json.loads(found.group(1))
    code = url.partition("/ui/signin#code=")[2]
    assert len(code) == 43 and code not in argument + result.stdout + result.stderr
    assert _spend(url)[0] == 200  # the file leads to the live link


@needs_chromium()
@needs_other_user()
async def test_sidecar_ui_through_chromium_signs_in_with_no_code_on_any_command_line(
    daemon_process: DaemonProcess, tmp_path: Path
) -> None:
    def signed_in() -> bool:
        audit = daemon_process.paths.audit_file.read_text()
        return any(json.loads(line)["event"] == "console.signin" for line in audit.splitlines() if line.strip())

    with chromium_as_browser(tmp_path) as browser:
        daemon_process.env["BROWSER"] = browser
        async with watching_command_lines() as seen:
            result = await asyncio.to_thread(daemon_process.cli, "ui")
            await wait_until(signed_in, timeout=30)  # Chromium followed the file and spent the code
    assert "opening the sidecar console in your browser" in result.stdout
    assert [line for line in seen if "chromium" in line and "open-console" in line], "the watcher saw no browser"
    assert [line for line in seen if "code=" in line or "/ui/signin" in line] == []
