"""``sidecar serve`` keeps uvicorn out of the daemon's process (``sidecar.tuning.skip_uvicorn``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import sys
from sidecar.tuning import skip_uvicorn
skip_uvicorn()
from mcp.server.streamable_http import StreamableHTTPServerTransport
from sse_starlette import EventSourceResponse
print(sys.modules.get("uvicorn") is None, "click" in sys.modules, EventSourceResponse.__name__)
"""


@pytest.mark.slow
def test_the_sdks_sse_responses_import_without_uvicorn() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "EventSourceResponse"]
