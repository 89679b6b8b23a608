"""``sidecar audit`` without ``--json``: one readable line per record (``sidecar.cli.auditlog``)."""

from __future__ import annotations

import json

from sidecar.cli.auditlog import human_line


def test_a_record_is_one_line_time_kind_then_what_says_most() -> None:
    record = {
        "seq": 3,
        "ts": "2026-12-03T07:18:33.916Z",
        "event": "tool.call",
        "via": "mcp",
        "outcome": "ok",
        "tool": "calculate",
        "session": "s_1",
        "prev": "a" * 64,
        "hash": "b" * 64,
    }
    line = human_line(json.dumps(record))
    assert line.startswith("2026-12-03 07:18:33  tool.call ")
    assert line.split()[3:] == ["session=s_1", "tool=calculate", "outcome=ok", "via=mcp"]
    assert "a" * 64 not in line and "{" not in line and "\n" not in line


def test_text_a_connector_chose_is_escaped_and_bounded() -> None:
    record = {"ts": "2026-12-03T07:18:33Z", "event": "connector.failed", "reason": "\x1b[2J\u202e" + "x" * 500}
    line = human_line(json.dumps(record))
    assert "\x1b" not in line and "\u202e" not in line and "\\x1b" in line
    assert len(line) < 200


def test_a_line_that_is_not_a_record_is_shown_escaped() -> None:
    assert human_line("not json \x1b[31m\n") == "not json \\x1b[31m"
    assert human_line('["a list"]') == '["a list"]'
