"""preview: untrusted text shown on one line, escaped and bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.text import preview


def test_a_short_value_is_its_repr() -> None:
    assert preview("a'b") == repr("a'b")
    assert preview(42) == "42"


def test_a_long_value_is_cut_to_the_limit_and_marked() -> None:
    shown = preview("e" * 4000)
    assert len(shown) == 100 and shown.startswith("'eee") and shown.endswith("...")
    assert preview("x" * 10, 10) == "'xxxxxx..."


def test_unquoted_text_keeps_printable_characters_and_escapes_the_rest() -> None:
    assert preview("naïve café", quote=False) == "naïve café"
    assert preview("a\nb\x1b[31m\u202ec\r", quote=False) == "a\\nb\\x1b[31m\\u202ec\\r"


def test_unquoted_text_one_over_the_limit_is_marked_as_cut() -> None:
    assert preview("x" * 100, quote=False) == "x" * 100
    assert preview("x" * 101, quote=False) == "x" * 97 + "..."


def test_a_limit_too_small_for_the_marker_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="limit"):
        preview("x", 3)


@given(st.text(), st.integers(min_value=4, max_value=300), st.booleans())
def test_a_preview_is_bounded_and_printable_whatever_the_input(text: str, limit: int, quote: bool) -> None:
    shown = preview(text, limit, quote=quote)
    assert len(shown) <= limit
    assert shown.isprintable()
