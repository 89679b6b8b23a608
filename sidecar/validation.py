"""What is wrong with validated input, said one way everywhere: a pydantic ``ValidationError`` as lines.

Every line names where the input came from (a file, ``--port``, ``SIDECAR_PORT``, a request body), the field
path inside it and what is wrong, ``<source>: <field path>: <what>``::

    /home/ann/.config/sidecar/mcp.json: mcpServers.github.command: must be a string, got a list
    /home/ann/.config/sidecar/mcp.json: mcpServers.github.headers['Bad Header']: is not a valid header name

A problem with the input as a whole has no field path (``<source>: the top level must be an object``).

A value is echoed only where it is the answer (a choice that is none of the choices), and then bounded to
``MAX_QUOTE`` characters and repr-escaped; a type error names the kind it got (``got a list``), never the
value, since the value may be a secret (an env value, a header). Validators that put a value in their own
message quote it with ``quote``; as a last guard no line's ``what`` runs past ``_MAX_WHAT`` characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Final

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from sidecar.text import preview

__all__ = ["MAX_QUOTE", "Loc", "error_lines", "field_path", "problem_line", "quote", "render_errors"]

Loc = tuple[int | str, ...]
"""Where a value sits in its input: keys and list indexes, outermost first (pydantic's ``loc``)."""

MAX_QUOTE: Final = 60
"""Characters of a value quoted back in a message (a key, a host, a choice); longer ones end in ``…``."""
_MAX_WHAT: Final = 400  # characters of one problem's description; a validator's own text is cut here
# A key shown bare in a field path (``env.NODE_OPTIONS``); any other is quoted (``headers['Bad Header']``).
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEY_MARK: Final = "[key]"  # pydantic's last loc part for an error in a dict key rather than its value

_EXPECTED: Final = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "none_required": "null",
}
"""Type errors: what the field must be. The message adds the kind it got, never the value."""
_PREFIXES: Final = ("Value error, ", "Assertion failed, ")  # pydantic's wrapping of a validator's own message


def quote(value: object) -> str:
    """``value`` as text (``str()`` unless it is one) in quotes, escaped and at most ``MAX_QUOTE`` characters."""
    return preview(value if isinstance(value, str) else str(value), MAX_QUOTE)


def _kind(value: object) -> str:
    """What a JSON value is, in words, without the value: ``an object``, ``a list``, ``null``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def field_path(loc: Iterable[int | str]) -> str:
    """``mcpServers.github.args[0]``: plain keys joined by dots, indexes in brackets, other keys quoted.

    An error in a dict key ends in pydantic's ``[key]`` marker; the path ends at the key itself instead.
    """
    path = ""
    for part in loc:
        if part == _KEY_MARK:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            path += f".{part}" if path else part
        else:
            path += f"[{quote(part)}]"
    return path


def _given(value: object) -> str:
    """A short scalar as JSON writes it (``null``, ``true``, ``3``), a string quoted and cut; else its kind."""
    if isinstance(value, str):
        return quote(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value) if isinstance(value, int | float) else _kind(value)


def _what(error: ErrorDetails, *, whole: bool) -> str:
    """What is wrong with one value, in the house words (``must be a string, got a list``).

    ``whole``: the value is the input itself, so a type error says "the top level must be ...".
    """
    kind, ctx, given = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "missing":
        what = "missing"
    elif kind == "extra_forbidden":
        what = "unknown key (a typo?)"
    elif kind in _EXPECTED:
        what = f"must be {_EXPECTED[kind]}, got {_kind(given)}"
        if whole:
            what = "the top level " + what
    elif kind in ("literal_error", "enum"):
        # The choices come from the code; what was given is a scalar cut to MAX_QUOTE, or only its kind.
        what = f"must be {ctx['expected']}, got {_given(given)}"
    elif kind == "string_too_short" and ctx.get("min_length") == 1:
        what = "must not be empty"
    elif kind == "string_too_long" and isinstance(given, str):
        what = f"is {len(given)} characters; the limit is {ctx['max_length']}"
    elif kind == "too_long" and "actual_length" in ctx:
        what = f"has {ctx['actual_length']} items; the limit is {ctx['max_length']}"
    elif kind == "string_pattern_mismatch":
        what = f"must match the pattern {quote(ctx['pattern'])}"
    else:
        what = error["msg"]
        for prefix in _PREFIXES:
            what = what.removeprefix(prefix)
        what = what.replace("Input should", "must", 1)
    if len(what) > _MAX_WHAT:
        what = what[:_MAX_WHAT] + "…"
    return what


def problem_line(source: str, loc: Loc, what: str) -> str:
    """``<source>: <field path>: <what>``, or ``<source>: <what>`` for the input as a whole (empty ``loc``)."""
    path = field_path(loc)
    return f"{source}: {path}: {what}" if path else f"{source}: {what}"


def error_lines(exc: ValidationError, *, source: str | Callable[[Loc], str], prefix: Loc = ()) -> list[str]:
    """One line per problem in ``exc``, each ``<source>: <field path>: <what>``.

    ``source`` names the input: a string, or a function of an error's ``loc`` when the fields of one
    model came from several places (a file, the environment, a flag). ``prefix`` is where the validated
    value sits inside its file (``("mcpServers", "github")`` for one entry validated on its own); it
    leads every field path but is not passed to ``source``.
    """
    lines = []
    for error in exc.errors(include_url=False):
        where = source if isinstance(source, str) else source(tuple(error["loc"]))
        loc = (*prefix, *error["loc"])
        lines.append(problem_line(where, loc, _what(error, whole=not loc)))
    return lines


def render_errors(exc: ValidationError, *, source: str | Callable[[Loc], str], prefix: Loc = ()) -> str:
    """``error_lines`` as one message, a line per problem."""
    return "\n".join(error_lines(exc, source=source, prefix=prefix))
