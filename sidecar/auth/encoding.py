"""Canonical base64url and bearer-token primitives shared by route tokens and session envelopes.

Only one spelling of any byte string is accepted: unpadded base64url (RFC 4648 §5, §3.2) whose unused
trailing bits are zero (RFC 4648 §3.5). ``base64.urlsafe_b64decode`` alone is not enough: it accepts
padding, ``+`` and ``/``, and both ``QQ`` and ``QR`` decode to ``b"A"``. A credential with several
spellings lets a caller slip a "different" value past a cache, a log filter or a deny list, so the
decoder here refuses everything but the one form ``b64url_encode`` produces.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Final

from sidecar.errors import Unauthorized

__all__ = [
    "TOKEN_BYTES",
    "TOKEN_CHARS",
    "b64url_decode",
    "b64url_encode",
    "check_token",
    "mint_token",
    "token_digest",
    "tokens_equal",
]

TOKEN_BYTES: Final = 32
"""Random bytes in a minted token (256 bits; also RFC 7636 §7.1's advice for a PKCE verifier)."""

TOKEN_CHARS: Final = 43
"""Length of ``b64url_encode`` of ``TOKEN_BYTES`` bytes: ceil(32 * 4 / 3)."""

# The base64url alphabet and nothing else: no padding, no whitespace, no "+" or "/".
_ALPHABET: Final = re.compile(r"[A-Za-z0-9_-]*")


def b64url_encode(data: bytes) -> str:
    """Encode ``data`` as base64url without padding (the only form ``b64url_decode`` accepts)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, *, max_len: int | None = None) -> bytes:
    """Decode canonical unpadded base64url; raise ``ValueError`` for any other spelling.

    Refused: characters outside ``A-Z a-z 0-9 - _`` (so padding, whitespace, ``+``, ``/`` and
    non-ASCII), a length of 1 mod 4 (no byte string encodes to that), and non-zero unused trailing
    bits (``QR`` for ``QQ``), checked by re-encoding. ``max_len`` caps the decoded size in bytes and
    is checked on the text's length before any decoding work.
    """
    if not isinstance(text, str):
        raise ValueError("base64url input must be str")
    if max_len is not None and len(text) > (4 * max_len + 2) // 3:
        raise ValueError("base64url input too long")
    # SECURITY: fullmatch over an explicit ASCII class; str.isalnum() would admit non-ASCII digits.
    if _ALPHABET.fullmatch(text) is None:
        raise ValueError("not base64url: characters outside the alphabet")
    if len(text) % 4 == 1:
        raise ValueError("not base64url: impossible length")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:  # unreachable after the checks above; kept as a ValueError anyway
        raise ValueError("not base64url") from exc
    # SECURITY: one spelling per value (RFC 4648 §3.5): reject non-zero trailing bits such as "QR".
    if b64url_encode(data) != text:
        raise ValueError("not canonical base64url")
    return data


def mint_token() -> str:
    """A fresh bearer token: ``TOKEN_BYTES`` bytes from ``secrets``, base64url, ``TOKEN_CHARS`` chars."""
    return b64url_encode(secrets.token_bytes(TOKEN_BYTES))  # SECURITY: CSPRNG, 256 bits


def token_digest(token: str) -> bytes:
    """SHA-256 of the ASCII token: a dict key to find a route by token without keeping tokens as keys.

    Finding the candidate by digest and then confirming with ``tokens_equal`` keeps the lookup from
    leaking the token through string-comparison timing. Raise ``ValueError`` for non-ASCII input.
    """
    try:
        raw = token.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("token is not ASCII") from None
    return hashlib.sha256(raw).digest()


def check_token(presented: str | None, expected_digest: bytes, *, what: str) -> None:
    """Return if ``presented`` is the token whose ``token_digest`` is ``expected_digest``; else ``Unauthorized``.

    The message names ``what`` (``control token``, ...): ``missing …`` (no token), ``malformed …`` (not
    ASCII, so never a minted token), ``invalid …`` (any other token). The comparison is constant-time
    over the fixed-length digests, so its timing says nothing about how much of a guess was right.
    """
    if presented is None:
        raise Unauthorized(f"missing {what}")
    try:
        digest = token_digest(presented)
    except ValueError:
        raise Unauthorized(f"malformed {what}") from None
    # SECURITY: constant-time compare of fixed-length digests.
    if not hmac.compare_digest(digest, expected_digest):
        raise Unauthorized(f"invalid {what}")


def tokens_equal(a: str, b: str) -> bool:
    """Constant-time token comparison; ``False`` (never ``TypeError``) when either side is not ASCII."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    try:
        a_raw = a.encode("ascii")
        b_raw = b.encode("ascii")
    except UnicodeEncodeError:
        # A minted token is always ASCII, so a non-ASCII candidate cannot match; returning early only
        # reveals what the caller already knows about its own input.
        return False
    # SECURITY: compare bytes, not str: compare_digest raises TypeError on non-ASCII str.
    return hmac.compare_digest(a_raw, b_raw)
