"""The daemon's process tuning (``sidecar.tuning``): uvicorn kept out, the collector tuned only when ours."""

from __future__ import annotations

import gc

import pytest

from sidecar import tuning
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


def test_a_process_that_only_hosts_the_daemon_keeps_its_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests start hundreds of daemons in one process: a full collection at each start was most of
    # the fast loop's time, and freezing would keep every earlier daemon's objects forever.
    collections: list[int] = []
    monkeypatch.setattr(tuning.gc, "collect", lambda *generation: collections.append(0) or 0)
    monkeypatch.setattr(tuning.gc, "freeze", lambda: collections.append(1))
    before = gc.get_threshold()
    tuning.settle(dedicated=False)
    assert (collections, gc.get_threshold()) == ([], before)

    monkeypatch.setattr(tuning.gc, "set_threshold", lambda *thresholds: collections.append(len(thresholds)))
    tuning.settle(dedicated=True)
    assert collections == [0, 1, 3]  # collected, froze, set all three thresholds
