"""Canonical base64url and token helpers: exactly one spelling is accepted, comparisons never raise."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.auth.encoding import (
    TOKEN_CHARS,
    b64url_decode,
    b64url_encode,
    mint_token,
    token_digest,
    tokens_equal,
)


@pytest.mark.parametrize(
    ("data", "text"),
    [(b"", ""), (b"A", "QQ"), (b"AB", "QUI"), (b"ABC", "QUJD"), (b"\xfb\xff", "-_8")],
)
def test_encode_is_unpadded_base64url(data: bytes, text: str) -> None:
    assert b64url_encode(data) == text
    assert b64url_decode(text) == data


@given(st.binary(max_size=200))
def test_decode_inverts_encode(data: bytes) -> None:
    assert b64url_decode(b64url_encode(data)) == data


def test_stdlib_accepts_the_non_canonical_sibling_we_refuse() -> None:
    # The pitfall this module exists for: both spellings decode to the same byte.
    assert base64.urlsafe_b64decode("QQ==") == base64.urlsafe_b64decode("QR==") == b"A"
    assert b64url_decode("QQ") == b"A"
    with pytest.raises(ValueError, match="canonical"):
        b64url_decode("QR")


@pytest.mark.parametrize(
    "text",
    [
        "QR",  # non-zero trailing bits (1 byte)
        "QUJ",  # canonical is QUI (2 bytes)
        "-_9",  # canonical is -_8
        "QQ==",  # padding
        "QQ=",
        "QUJD====",
        "+/8",  # standard alphabet, not url-safe
        "QU/D",
        "QU+D",
        " QUJD",  # whitespace anywhere
        "QUJD ",
        "QU JD",
        "QUJD\n",
        "QU\tJD",
        "Q",  # length 1 mod 4 encodes nothing
        "QUJDR",
        "QUJ\u0414",  # non-ASCII letter
        "QUJ\uff24",  # fullwidth D
        "\u0661\u0662\u0663\u0664",  # Arabic-Indic digits: str.isalnum() would say yes
        "QUJD\x00",
        "QU.D",
    ],
)
def test_decode_refuses_every_non_canonical_spelling(text: str) -> None:
    with pytest.raises(ValueError):  # the reason varies by case; the type is the contract
        b64url_decode(text)


@given(st.text(max_size=64))
def test_decode_raises_only_value_error_and_round_trips_what_it_accepts(text: str) -> None:
    try:
        data = b64url_decode(text)
    except ValueError:
        return
    assert b64url_encode(data) == text


def test_decode_refuses_non_str_input() -> None:
    with pytest.raises(ValueError, match="str"):
        b64url_decode(b"QUJD")  # type: ignore[arg-type]


def test_max_len_caps_decoded_bytes() -> None:
    text = b64url_encode(bytes(32))
    assert b64url_decode(text, max_len=32) == bytes(32)
    with pytest.raises(ValueError, match="too long"):
        b64url_decode(text, max_len=31)
    with pytest.raises(ValueError, match="too long"):
        b64url_decode(b64url_encode(bytes(33)), max_len=32)


def test_max_len_is_checked_before_the_alphabet() -> None:
    with pytest.raises(ValueError, match="too long"):
        b64url_decode("!" * 10_000, max_len=32)


def test_minted_token_is_43_canonical_chars_of_32_bytes() -> None:
    token = mint_token()
    assert len(token) == TOKEN_CHARS == 43
    assert len(b64url_decode(token)) == 32


def test_minted_tokens_are_unique() -> None:
    assert len({mint_token() for _ in range(1000)}) == 1000


def test_token_digest_is_sha256_of_ascii_token() -> None:
    token = mint_token()
    assert token_digest(token) == hashlib.sha256(token.encode("ascii")).digest()
    assert token_digest(token) != token_digest(mint_token())


@pytest.mark.parametrize("token", ["t\u00f6ken", "\ud800", "\u200btoken"])
def test_token_digest_refuses_non_ascii(token: str) -> None:
    with pytest.raises(ValueError, match="ASCII"):
        token_digest(token)


def test_tokens_equal_matches_only_identical_tokens() -> None:
    token = mint_token()
    assert tokens_equal(token, token)
    assert tokens_equal(token, "".join(token))  # equal value, distinct object
    assert not tokens_equal(token, mint_token())
    assert not tokens_equal(token, token[:-1])
    assert not tokens_equal(token, token + "A")
    assert not tokens_equal(token, "")


@pytest.mark.parametrize("other", ["t\u00f6ken", "\ud800", "\u0410" * 43])
def test_tokens_equal_returns_false_for_non_ascii_instead_of_type_error(other: str) -> None:
    token = mint_token()
    assert not tokens_equal(token, other)
    assert not tokens_equal(other, token)
    assert not tokens_equal(other, other)  # a non-ASCII value is never a token, not even equal to itself


def test_tokens_equal_returns_false_for_non_str() -> None:
    assert not tokens_equal(mint_token(), None)  # type: ignore[arg-type]
    assert not tokens_equal(b"abc", "abc")  # type: ignore[arg-type]


@given(st.text(max_size=50), st.text(max_size=50))
def test_tokens_equal_never_raises(a: str, b: str) -> None:
    assert tokens_equal(a, b) == (a == b and a.isascii())
