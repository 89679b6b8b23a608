"""FailureLog: each connector's latest failed process, its stderr bounded and escaped, in bounded memory."""

from __future__ import annotations

import logging

import pytest

from sidecar.connectors.failures import LINE_CHARS, SHOWN_LINES, FailureLog


def test_the_latest_failure_replaces_the_one_before_and_keeps_the_last_lines() -> None:
    log = FailureLog()
    log.record("echo", "s1", reason="exited with code 1", stderr=["old"])
    failure = log.record("echo", "s2", reason="exited with code 3", stderr=[f"line {i}" for i in range(50)])
    assert log.last("echo") is failure
    assert (failure.session_id, failure.reason) == ("s2", "exited with code 3")
    assert failure.stderr == tuple(f"line {i}" for i in range(50 - SHOWN_LINES, 50))
    assert log.last("other") is None


def test_lines_and_reason_are_escaped_and_bounded() -> None:
    failure = FailureLog().record("c", "s", reason="bad\nreason\x1b", stderr=["\x1b[2J\u202e", "y" * 10_000])
    assert failure.reason == "bad\\nreason\\x1b"
    assert failure.stderr[0] == "\\x1b[2J\\u202e"
    assert len(failure.stderr[1]) == LINE_CHARS and failure.stderr[1].endswith("...")


def test_a_failure_is_logged_once_at_warning_with_its_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.connectors.failures")
    FailureLog().record("c", "s", reason="exited with code 3", stderr=["one", "two\x07"])
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "connector c (session s) failed: exited with code 3; its last stderr lines:" + (
        "\n  | one\n  | two\\x07"
    )


def test_only_the_most_recent_connectors_are_remembered() -> None:
    log = FailureLog()
    for number in range(300):
        log.record(f"c{number}", "s", reason="exited", stderr=[])
    assert log.last("c0") is None and log.last("c43") is None
    assert log.last("c44") is not None and log.last("c299") is not None
