"""The daemon tunes the garbage collector of its own process only (``sidecar.tuning``)."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

import pytest

import sidecar.daemon
from sidecar.cli import cmd_serve
from sidecar.paths import Paths
from sidecar.tuning import GC_THRESHOLDS
from tests.conftest import Daemon
from tests.helpers import run_probe

PROBE = """
import gc
from sidecar.tuning import GC_THRESHOLDS, settle_collector
survivor = [object() for _ in range(3)]
before = (gc.get_threshold(), gc.get_freeze_count())
settle_collector()
after = (gc.get_threshold(), gc.get_freeze_count())
print(before[0] != GC_THRESHOLDS, after[0] == GC_THRESHOLDS, after[1] > before[1] + 1000)
"""


@pytest.mark.slow
def test_settling_freezes_what_start_up_left_and_raises_the_first_threshold() -> None:
    assert run_probe(PROBE) == ["True", "True", "True"]


def test_sidecar_serve_runs_the_daemon_as_its_own_process(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    seen: dict[str, Any] = {}

    async def fake_serve(settings: Any, paths: Paths, **kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(sidecar.daemon, "serve", fake_serve)
    args = argparse.Namespace(host="127.0.0.1", port=0, verbose=False)

    assert cmd_serve(args, Paths.resolve({"SIDECAR_HOME": str(home)})) == 0
    assert seen == {"dedicated": True}


async def test_a_daemon_hosted_in_a_process_leaves_its_collector_alone(daemon: Daemon) -> None:
    assert gc.get_threshold() != GC_THRESHOLDS
    assert gc.get_freeze_count() == 0
