"""A connector's result, marked as what it is: content from that connector, not instructions.

Tool output is an injection surface: a web page, an issue body or a file a connector returns can say
"ignore your instructions". The model cannot be made immune, but it can be told, in the result itself,
where a text came from. So every connector result carries its origin in ``_meta``
(``dev.sidecar/origin``: the connector and that its content is untrusted), and, unless
``[tools] mark_connector_output`` is false, each of its text blocks is fenced::

    <untrusted-content connector="github" fence="9c1e0f3a">
    …the connector's text…
    </untrusted-content fence="9c1e0f3a">

The fence is random per result, so the text cannot close it early by writing the end line itself.
Structured content and non-text blocks (images, resources) pass unchanged; the origin covers them.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from sidecar.bus.registry import ToolOutput

__all__ = ["ORIGIN_META", "marked"]

ORIGIN_META: Final = "dev.sidecar/origin"
"""The ``_meta`` key of a connector result's origin."""


def _fenced(text: str, connector_id: str, fence: str) -> str:
    return (
        f'<untrusted-content connector="{connector_id}" fence="{fence}">\n{text}\n</untrusted-content fence="{fence}">'
    )


def _blocks(blocks: Any, connector_id: str, fence: str) -> Any:
    if not isinstance(blocks, list | tuple):
        return blocks
    return [
        {**block, "text": _fenced(block["text"], connector_id, fence)}
        if isinstance(block, Mapping) and block.get("type") == "text" and isinstance(block.get("text"), str)
        else block
        for block in blocks
    ]


def marked(output: ToolOutput, *, connector_id: str, wrap: bool) -> ToolOutput:
    """``output`` with its origin in ``_meta`` and (``wrap``) its text blocks fenced as untrusted."""
    origin = {"connector": connector_id, "untrusted": True}
    raw = dict(output.raw) if output.raw is not None else None
    if raw is not None:
        meta = raw.get("_meta")
        raw["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), ORIGIN_META: origin}
    if not wrap:
        return replace(output, raw=raw, meta={ORIGIN_META: origin})
    fence = secrets.token_hex(4)
    content = output.content
    if content is not None:
        content = tuple(_blocks(list(content), connector_id, fence))
    if raw is not None and "content" in raw:
        raw["content"] = _blocks(raw["content"], connector_id, fence)
    return replace(
        output,
        text=_fenced(output.text, connector_id, fence),
        content=content,
        raw=raw,
        meta={ORIGIN_META: origin},
    )
