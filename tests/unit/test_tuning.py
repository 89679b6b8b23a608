"""``sidecar serve`` keeps uvicorn out of the daemon's process (``sidecar.tuning.skip_uvicorn``)."""

from __future__ import annotations

import pytest

from tests.helpers import run_probe

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
    assert run_probe(PROBE) == ["True", "False", "EventSourceResponse"]
