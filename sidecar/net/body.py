"""Bounded request bodies (contract §3): size, read time and JSON nesting depth, checked
before any parser, and one strict JSON reading of every JSON body (MCP, REST, control).

``json.loads`` raises ``RecursionError`` near depth 1000, keeps the last of duplicate member names, and
accepts ``NaN``; a slow client can hold a handler forever. All of these are answered here with a 4xx
whose message says what is wrong without quoting the body.

An MCP body is also checked to be one JSON-RPC 2.0 message (``read_jsonrpc``) before the MCP SDK sees
it: the SDK's own answer to a message that fails its model quotes the offending values back (pydantic's
``input_value=...``), and its "Method not found" carries the method name. Refused here, the answer names
the problem only (issue 11 item 3).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

from sidecar.config import Limits
from sidecar.errors import BodyTooDeep, BodyTooLarge, MalformedJson, ReadTimedOut, RequestRejected
from sidecar.store.files import StrictJsonError, loads_strict

__all__ = ["json_depth_exceeds", "jsonrpc_problem", "read_body", "read_json", "read_jsonrpc"]

_OPEN: Final = frozenset(b"[{")
_CLOSE: Final = frozenset(b"]}")
_QUOTE: Final = ord('"')
_BACKSLASH: Final = ord("\\")
_MAX_METHOD: Final = 128
"""Characters of a JSON-RPC method name (MCP's longest is about 40)."""
_METHOD_CHARS: Final = frozenset(chr(c) for c in range(0x21, 0x7F)) - frozenset("\"&'<>\\")
"""Visible ASCII without quotes, backslash or markup: every MCP method (``tools/call``,
``notifications/initialized``) and any plausible extension's; a name outside it names no method, and the
SDK would quote it back in its "Method not found"."""


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


async def read_jsonrpc(request: web.Request, limits: Limits) -> tuple[bytes, Any]:
    """``read_json``, and then the body must be one JSON-RPC 2.0 message (``jsonrpc_problem``); else
    ``RequestRejected`` (JSON-RPC -32600 under ``/mcp``) naming the problem, never a value."""
    body, data = await read_json(request, limits)
    problem = jsonrpc_problem(data)
    if problem is not None:
        raise RequestRejected(f"not a JSON-RPC 2.0 message: {problem}")
    return body, data


def jsonrpc_problem(message: Any) -> str | None:
    """What keeps ``message`` from being one JSON-RPC 2.0 request, notification, response or error as MCP
    has them (``mcp_types.JSONRPC*``), or None.

    At least as strict as the SDK's own models, so that what passes here never fails there: an id is a
    string or an integer (not a boolean or a float), ``params`` an object or null, a result an object, an
    error an object with an integer ``code`` and a string ``message``; and a method name is 1-128 visible
    ASCII characters other than quotes, backslash and ``<>&``. A batch (a list) is refused: MCP's
    Streamable HTTP takes one message per POST.
    """
    if not isinstance(message, Mapping):
        return "the body must be one message object (no batches)"
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if "method" in message:
        method = message["method"]
        if not isinstance(method, str) or not 0 < len(method) <= _MAX_METHOD or not set(method) <= _METHOD_CHARS:
            return f"method must be a name of 1-{_MAX_METHOD} visible ASCII characters"
        if "id" in message and not _is_id(message["id"]):
            return "id must be a string or an integer"
        params = message.get("params")
        if params is not None and not isinstance(params, Mapping):
            return "params must be an object"
        return None
    if "result" in message:
        if not _is_id(message.get("id")):
            return "a response's id must be a string or an integer"
        return None if isinstance(message["result"], Mapping) else "result must be an object"
    if "error" in message:
        if "id" not in message or not (message["id"] is None or _is_id(message["id"])):
            return "an error's id must be a string, an integer or null"
        error = message["error"]
        if (
            not isinstance(error, Mapping)
            or type(error.get("code")) is not int
            or not isinstance(error.get("message"), str)
        ):
            return "error must be an object with an integer code and a string message"
        return None
    return "a message has a method, a result or an error"


def _is_id(value: object) -> bool:
    return isinstance(value, str) or type(value) is int  # bool is an int subclass; the SDK refuses it


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
