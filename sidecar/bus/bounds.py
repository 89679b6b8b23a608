"""Tool results bounded for the agent's context window (``[tools] max_result_chars``).

A result's text longer than the bound is cut there, and a marker says how many characters were left
out; structured content whose JSON is longer than the bound is left out whole (half a JSON value is
no value), with the same kind of marker. The marker comes after the text it follows and is not
counted in the bound.

A connector's content blocks are bounded together: text blocks (and embedded text resources) share
one budget in order, the block that crosses it is cut, later ones are left out, and the markers
follow as one last text block. Images, audio and binary resources pass as they are: they are not
text the model reads. A relayed result (``ToolOutput.raw``) is bounded the same way; when its
structured content is left out it becomes an error result, because a client checks a successful
result against the tool's ``outputSchema`` and would reject one without it (MCP 2025-06-18 and
later: a tool with an output schema must return structured content that conforms).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from sidecar.bus.registry import ToolOutput

__all__ = ["DEFAULT_MAX_RESULT_CHARS", "bound_output"]

DEFAULT_MAX_RESULT_CHARS: Final = 8000
"""The default bound (``config.ToolSettings.max_result_chars``): about 2 000 tokens of English."""
_SIZE_ENCODER: Final = json.JSONEncoder(default=str)
"""Measures structured content (one encoder: ``json.dumps(..., default=str)`` builds one a call)."""
_SETTING: Final = "[tools] max_result_chars"


def bound_output(output: ToolOutput, limit: int) -> ToolOutput:
    """``output`` with its text, content blocks, structured content and relayed result within ``limit``."""
    structured, dropped = _bound_structured(output.structured, limit)
    text = _bound_text(output.text, limit)
    if dropped is not None:
        text = f"{text}\n{dropped}" if text else dropped
    content = _bound_blocks(output.content, limit, dropped) if output.content is not None else None
    raw, raw_dropped = _bound_raw(output.raw, limit) if output.raw is not None else (None, False)
    if (text, structured, content, raw) == (output.text, output.structured, output.content, output.raw):
        return output
    return dataclasses.replace(
        output,
        text=text,
        structured=structured,
        content=content,
        raw=raw,
        is_error=output.is_error or raw_dropped,
    )


def _text_marker(left_out: int, total: int, limit: int) -> str:
    return f"[truncated: {left_out} of {total} characters left out; results are cut at {limit} ({_SETTING})]"


def _structured_marker(size: int, limit: int) -> str:
    return f"[truncated: structured content of {size} characters left out; results are cut at {limit} ({_SETTING})]"


def _bound_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n{_text_marker(len(text) - limit, len(text), limit)}"


def _bound_structured(structured: Any, limit: int) -> tuple[Any, str | None]:
    """The structured content, or None and the marker when its JSON is longer than ``limit``."""
    if structured is None:
        return None, None
    size = len(_SIZE_ENCODER.encode(structured))
    if size <= limit:
        return structured, None
    return None, _structured_marker(size, limit)


def _bound_blocks(
    blocks: tuple[Mapping[str, Any], ...], limit: int, dropped: str | None
) -> tuple[Mapping[str, Any], ...]:
    budget, total, left_out = limit, 0, 0
    kept: list[Mapping[str, Any]] = []
    for block in blocks:
        text = _block_text(block)
        if text is None:
            kept.append(block)
            continue
        total += len(text)
        if len(text) <= budget:
            kept.append(block)
            budget -= len(text)
            continue
        left_out += len(text) - budget
        if budget > 0:
            kept.append(_with_text(block, text[:budget]))
        budget = 0
    markers = [_text_marker(left_out, total, limit)] if left_out else []
    if dropped is not None:
        markers.append(dropped)
    if not markers:
        return blocks
    return (*kept, {"type": "text", "text": "\n".join(markers)})


def _bound_raw(raw: Mapping[str, Any], limit: int) -> tuple[Mapping[str, Any], bool]:
    """The relayed result bounded, and whether its structured content was left out (an error now)."""
    _, dropped = _bound_structured(raw.get("structuredContent"), limit)
    content = raw.get("content")
    blocks = tuple(b for b in content if isinstance(b, Mapping)) if isinstance(content, list) else ()
    bounded = _bound_blocks(blocks, limit, dropped)
    if bounded is blocks:
        return raw, False
    result = {**raw, "content": list(bounded)}
    if dropped is not None:
        del result["structuredContent"]
        result["isError"] = True  # see the module docstring: a success without it would be rejected
    return result, dropped is not None


def _block_text(block: Mapping[str, Any]) -> str | None:
    """The text a block puts in the context window: a text block's, or an embedded text resource's."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    resource = block.get("resource")
    if block.get("type") == "resource" and isinstance(resource, Mapping) and isinstance(resource.get("text"), str):
        return str(resource["text"])
    return None


def _with_text(block: Mapping[str, Any], text: str) -> Mapping[str, Any]:
    if block.get("type") == "text":
        return {**block, "text": text}
    return {**block, "resource": {**block["resource"], "text": text}}
