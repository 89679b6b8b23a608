"""``sidecar ui`` as a user runs it: the CLI against a daemon process, the printed link used by a client."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from tests.conftest import DaemonProcess

pytestmark = pytest.mark.slow  # the daemon and the CLI are processes


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _open(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(url, timeout=15) as response:
            return response.status, response.headers.get("Set-Cookie", "")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Set-Cookie", "")


def test_sidecar_ui_prints_a_link_that_signs_in_once(daemon_process: DaemonProcess) -> None:
    result = daemon_process.cli("ui", "--no-browser")
    found = re.search(r"(http://127\.0\.0\.1:(\d+)/ui/signin\?code=[A-Za-z0-9_-]{43})\s", result.stdout)
    assert found is not None, result.stdout
    assert "works once, within 60 s" in result.stdout
    url, port_text = found.group(1), found.group(2)
    status, cookie = _open(url)
    assert status == 303 and cookie.startswith(f"sidecar_console_{port_text}=")
    assert _open(url) == (403, "")


def test_sidecar_ui_without_a_daemon_says_so(daemon_process: DaemonProcess) -> None:
    daemon_process.cli("stop")
    result = daemon_process.cli("ui", "--no-browser", check=False)
    assert result.returncode == 1 and "no sidecar daemon is running" in result.stderr
