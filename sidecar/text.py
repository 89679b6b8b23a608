"""Untrusted text made safe to show on one line of a message or a log: escaped, and bounded.

Client-supplied values (a ``Host`` header, a tool pattern, a JSON key) and a connector's own output (its
stderr, its error messages) end up in log lines, error messages and ``sidecar connectors show``. Shown
raw, a newline forges a log line, an ESC drives the reader's terminal, a bidi control reorders the text,
and a megabyte floods the log. ``preview`` is the one way such text is shown.
"""

from __future__ import annotations

from typing import Final

__all__ = ["preview"]

_CUT: Final = "..."
"""Ends a preview that was cut."""


def preview(value: object, limit: int = 100, *, quote: bool = True) -> str:
    """``value`` as at most ``limit`` characters of printable text; a longer rendering is cut and ends ``...``.

    ``quote=True`` renders ``repr(value)``: a string in quotes with backslash escapes, the form for naming
    a value inside a sentence. ``quote=False`` renders a string as itself but with every non-printable
    character escaped (``\\n``, ``\\x1b``, ``\\u202e``; ``str.isprintable``), and any other value by its
    ``str``: the form for text shown as text, such as a connector's stderr line or error message.
    """
    if limit <= len(_CUT):
        raise ValueError(f"preview limit must exceed {len(_CUT)}, got {limit}")
    if isinstance(value, str) and len(value) > limit:
        value = value[: limit + 1]  # every character renders as one or more: the rest could not show
    if quote:
        text = repr(value)
    else:
        text = value if isinstance(value, str) else str(value)
        if not text.isprintable():
            text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT
