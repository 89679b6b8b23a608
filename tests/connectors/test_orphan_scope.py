"""Where the daemon adopts orphans and where it must not (issue 11 item 5), without starting a process.

A child subreaper is process-wide: only ``sidecar serve`` (``serve(dedicated=True)``) becomes one. A
process that hosts ``serve()`` among other work, as this test runner does, keeps its children's orphans
and exit statuses to itself; its connector processes keep exactly the environment they were given.
"""

from __future__ import annotations

import os

from sidecar.connectors.stdio.orphans import ORPHANAGE, TREE_VARIABLE, Orphanage
from sidecar.system import environ_value, is_child_subreaper, proc_table
from tests.conftest import Daemon


async def test_a_daemon_hosted_in_another_process_does_not_make_it_a_subreaper(daemon: Daemon) -> None:
    assert await daemon.control("GET", "/healthz") == {"status": "ok"}
    assert not is_child_subreaper()
    assert not ORPHANAGE.active


def test_an_inactive_orphanage_tags_nothing_and_touches_nothing() -> None:
    orphanage = Orphanage()
    assert orphanage.new_tree() is None  # the connector's environment stays exactly as given
    table = proc_table(0) or {}
    assert orphanage.adopted(None, table) == []
    orphanage.release(None)
    orphanage.sweep()
    assert (orphanage.reaped, orphanage.killed) == (0, 0)


def test_the_environment_a_process_started_with_is_read_from_proc() -> None:
    # /proc/<pid>/environ is the environment at exec: this process's PATH is there, a name never set is not.
    assert environ_value(os.getpid(), "PATH") == os.environ.get("PATH")
    assert environ_value(os.getpid(), TREE_VARIABLE) is None
    assert environ_value(2**22 + 1, "PATH") is None  # no such process
