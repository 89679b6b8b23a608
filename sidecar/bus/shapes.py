"""Argument *shapes* for audit records: what a tool call's arguments look like, never what they say.

The audit log must never hold a secret, and tool arguments are where secrets travel (tokens, e-mail
bodies, file contents). So the bus records ``shape_of(arguments)``: the types and the identifier-like
keys, bounded in depth and size, so a record stays small whatever the call.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["shape_of"]

_SHAPE_DEPTH: Final = 6  # nesting shown before a container is summarised as "dict"/"list"
_SHAPE_KEYS: Final = 32  # keys shown per object
_SHAPE_ITEMS: Final = 4  # distinct item shapes shown per array
_SHAPE_BUDGET: Final = 256  # nodes in the whole shape: bounds the record whatever the arguments
_KEY_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_MORE: Final = "…"


def shape_of(value: object) -> object:
    """The *shape* of tool arguments — types and keys, never values — bounded in depth and size.

    ``{"a": "x", "b": {"c": 1}, "l": ["s", "t"]}`` → ``{"a": "str", "b": {"c": "int"}, "l": ["str"]}``.
    Scalars become ``"str" "int" "float" "bool" "null"``; arrays list their distinct item shapes.
    # SECURITY: keys are kept only when they look like identifiers (schema property names); any other key
    # may itself be data (a map keyed by e-mail or token), so it is counted under ``"…"``, never written.
    """
    budget = [_SHAPE_BUDGET]
    return _shape(value, 0, budget)


_SCALARS: Final[tuple[tuple[type, str], ...]] = (
    (bool, "bool"),  # before int: bool is an int
    (int, "int"),
    (float, "float"),
    (str, "str"),
    (type(None), "null"),
)


def _shape(value: object, depth: int, budget: list[int]) -> object:
    budget[0] -= 1
    for kind, name in _SCALARS:
        if isinstance(value, kind):
            return name
    if isinstance(value, dict):
        return "dict" if depth >= _SHAPE_DEPTH or budget[0] <= 0 else _shape_dict(value, depth, budget)
    if isinstance(value, list | tuple):
        return "list" if depth >= _SHAPE_DEPTH or budget[0] <= 0 else _shape_list(value, depth, budget)
    return "object"


def _shape_dict(value: dict[object, object], depth: int, budget: list[int]) -> dict[str, object]:
    out: dict[str, object] = {}
    hidden = 0
    for key, item in value.items():
        if isinstance(key, str) and _KEY_RE.fullmatch(key) and len(out) < _SHAPE_KEYS and budget[0] > 0:
            out[key] = _shape(item, depth + 1, budget)
        else:
            hidden += 1
    if hidden:
        out[_MORE] = f"{hidden} more keys"
    return out


def _shape_list(value: list[object] | tuple[object, ...], depth: int, budget: list[int]) -> list[object]:
    items: list[object] = []
    for item in value:
        if len(items) >= _SHAPE_ITEMS or budget[0] <= 0:
            break
        shape = _shape(item, depth + 1, budget)
        if shape not in items:
            items.append(shape)
    return items
