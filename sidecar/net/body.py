"""Bounded request bodies (contract §3): size, read time and JSON nesting depth, checked
before any parser, and one strict JSON reading of every JSON body (MCP, REST, control).

``json.loads`` raises ``RecursionError`` near depth 1000, keeps the last of duplicate member names, and
accepts ``NaN``; a slow client can hold a handler forever. All of these are answered here with a 4xx
whose message says what is wrong without quoting the body.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web

from sidecar.config import Limits
from sidecar.errors import BodyTooDeep, BodyTooLarge, MalformedJson, ReadTimedOut, RequestRejected
from sidecar.store.files import StrictJsonError, loads_strict

__all__ = ["json_depth_exceeds", "read_body", "read_json"]

_OPEN: Final = frozenset(b"[{")
_CLOSE: Final = frozenset(b"]}")
_QUOTE: Final = ord('"')
_BACKSLASH: Final = ord("\\")


async def read_body(request: web.Request, limits: Limits, *, json_body: bool = True) -> bytes:
    """Read the whole body within ``limits``; raise a ``RequestRejected`` subclass otherwise."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        raise BodyTooLarge(f"body of {declared} bytes is over the {limits.max_body_bytes} byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_read_timeout):
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise BodyTooLarge(f"body is over the {limits.max_body_bytes} byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise ReadTimedOut(f"body not received within {limits.body_read_timeout:g} seconds") from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise RequestRejected("body ended early") from exc
    body = b"".join(chunks)
    if json_body and json_depth_exceeds(body, limits.max_json_depth):
        raise BodyTooDeep(f"JSON nested deeper than {limits.max_json_depth} levels")
    return body


async def read_json(request: web.Request, limits: Limits, *, empty: bytes = b"") -> tuple[bytes, Any]:
    """The body as sent and as read by the one strict JSON reader; ``empty`` stands for a missing body.

    A body that is not JSON, holds ``NaN``, or names one member twice in any object is refused before
    anything else parses it (``MalformedJson``): a later parser that kept the last of two ``"method"``
    members would run what no check had read.
    """
    body = await read_body(request, limits) or empty
    try:
        return body, loads_strict(body)
    except StrictJsonError as exc:
        raise MalformedJson(f"body is not acceptable JSON: {exc.kind}") from None
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError; their text may quote the body
        raise MalformedJson("body is not valid JSON") from None


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True if the JSON text nests arrays/objects deeper than ``limit`` (strings are skipped)."""
    # Fast path: fewer openers than the limit cannot nest past it.
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    in_string = False
    escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif byte in _CLOSE:
            depth -= 1
    return False
