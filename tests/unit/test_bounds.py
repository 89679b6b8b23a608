"""``bus.bounds.bound_output``: what is cut, what is left out, what passes, and what the marker says."""

from __future__ import annotations

from typing import Any

from sidecar.bus.bounds import DEFAULT_MAX_RESULT_CHARS, bound_output
from sidecar.bus.registry import ToolOutput
from sidecar.config import ToolSettings

IMAGE = {"type": "image", "data": "A" * 500, "mimeType": "image/png"}


def _text(block: Any) -> str:
    assert block["type"] == "text", block
    return str(block["text"])


def test_the_default_bound_is_the_settings_default() -> None:
    assert ToolSettings().max_result_chars == DEFAULT_MAX_RESULT_CHARS == 8000


def test_a_result_within_the_bound_is_the_same_object() -> None:
    output = ToolOutput(
        text="x" * 100, structured={"a": 1}, content=({"type": "text", "text": "x" * 100},), raw={"content": []}
    )
    assert bound_output(output, 100) is output


def test_long_text_is_cut_at_the_bound_and_the_marker_says_how_much_was_left_out() -> None:
    bounded = bound_output(ToolOutput(text="x" * 250), 100)
    cut, marker = bounded.text.split("\n")
    assert cut == "x" * 100
    assert marker == "[truncated: 150 of 250 characters left out; results are cut at 100 ([tools] max_result_chars)]"


def test_long_structured_content_is_left_out_whole_with_a_marker() -> None:
    bounded = bound_output(ToolOutput(text="ok", structured={"data": "y" * 200}), 100)
    assert bounded.structured is None and not bounded.is_error
    assert bounded.text.startswith("ok\n[truncated: structured content of 212 characters left out;")


def test_content_blocks_share_one_budget_and_images_pass() -> None:
    blocks = (
        {"type": "text", "text": "a" * 60},
        IMAGE,
        {"type": "text", "text": "b" * 60},
        {"type": "resource", "resource": {"uri": "file:///x", "text": "c" * 60}},
        {"type": "text", "text": "d" * 10},
        IMAGE,
    )
    bounded = bound_output(ToolOutput(text="", content=blocks), 100)
    assert bounded.content is not None
    *kept, marker = bounded.content
    assert kept == [blocks[0], IMAGE, {"type": "text", "text": "b" * 40}, IMAGE]
    assert _text(marker).startswith("[truncated: 90 of 190 characters left out;")


def test_an_embedded_text_resource_is_cut_like_text() -> None:
    blocks = ({"type": "resource", "resource": {"uri": "file:///x", "mimeType": "text/plain", "text": "r" * 300}},)
    bounded = bound_output(ToolOutput(text="", content=blocks), 100)
    assert bounded.content is not None
    resource, marker = bounded.content
    assert resource == {
        "type": "resource",
        "resource": {"uri": "file:///x", "mimeType": "text/plain", "text": "r" * 100},
    }
    assert _text(marker).startswith("[truncated: 200 of 300 characters left out;")


def test_a_relayed_result_keeps_its_other_fields_and_loses_long_structured_content_as_an_error() -> None:
    raw = {
        "content": [{"type": "text", "text": "z" * 300}],
        "structuredContent": {"result": "z" * 300},
        "resultType": "complete",
        "_meta": {"k": "v"},
    }
    bounded = bound_output(ToolOutput(text="z", raw=raw), 100)
    assert bounded.raw is not None and bounded.is_error
    assert set(bounded.raw) == {"content", "resultType", "_meta", "isError"}
    assert bounded.raw["isError"] is True and bounded.raw["_meta"] == {"k": "v"}
    text, marker = bounded.raw["content"]
    assert text == {"type": "text", "text": "z" * 100}
    first, second = _text(marker).split("\n")
    assert first.startswith("[truncated: 200 of 300 characters left out;")
    assert second.startswith("[truncated: structured content of ")
    assert raw["structuredContent"] == {"result": "z" * 300}, "the connector's result was changed in place"


def test_a_relayed_result_with_only_long_text_stays_a_success() -> None:
    raw = {"content": [{"type": "text", "text": "z" * 300}], "isError": False}
    bounded = bound_output(ToolOutput(text="z", raw=raw), 100)
    assert bounded.raw is not None and bounded.raw["isError"] is False and not bounded.is_error
