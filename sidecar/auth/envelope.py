"""The ``X-Sidecar-Context`` session envelope (contract §4): sign claims, verify them strictly.

Wire form::

    v1.<kid>.<b64url(payload)>.<b64url(mac)>
    mac = HMAC-SHA256(keys[kid], ASCII bytes of "v1.<kid>.<b64url(payload)>")  # the text as sent

The payload is the canonical JSON of ``SessionClaims`` (sorted keys, no spaces, ASCII only, no NaN).
There is one version and one algorithm, so there is nothing to negotiate (RFC 8725 §3.1).

``EnvelopeKeys.verify`` works in a fixed order and parses nothing the MAC has not covered:

1. length cap and ASCII check on the whole header value;
2. exactly four dot-separated parts, the first ``v1``;
3. ``kid`` names a known key;
4. the MAC part is canonical base64url of exactly 32 bytes;
5. ``hmac.compare_digest`` against the HMAC of the text as sent;
6. only then: canonical base64url, UTF-8, a JSON object with exactly the six claim keys (no duplicates,
   no NaN/Infinity, strict types), serialised exactly as ``sign`` would have;
7. time: ``exp > now - leeway`` else "expired", ``iat <= now + leeway`` else "not yet valid".

Every failure is ``EnvelopeRejected`` whose message is one of the ``REASON_*`` strings, safe to show and
free of secrets. The envelope carries no permissions: callers look the session up by ``session_id`` and
use the daemon's own record, comparing the other claims with it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, cast

from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sidecar.auth.encoding import b64url_decode, b64url_encode
from sidecar.canonical import canonical_json
from sidecar.errors import EnvelopeRejected

__all__ = [
    "DEFAULT_LEEWAY",
    "KEY_BYTES",
    "MAX_ENVELOPE_CHARS",
    "MAX_FIELD_CHARS",
    "REASON_BAD_SIGNATURE",
    "REASON_EXPIRED",
    "REASON_MALFORMED",
    "REASON_NOT_YET_VALID",
    "REASON_UNKNOWN_KEY",
    "VERSION",
    "EnvelopeKeys",
    "SessionClaims",
]

VERSION: Final = "v1"
KEY_BYTES: Final = 32
"""Bytes of a generated MAC key; keys given to ``EnvelopeKeys`` must be at least this long (RFC 8725 §3.5)."""
MAX_ENVELOPE_CHARS: Final = 4096
"""Longest header value looked at; anything longer is refused before any other work."""
MAX_FIELD_CHARS: Final = 4096
"""Longest string claim, in characters."""
DEFAULT_LEEWAY: Final = 30
"""Clock skew tolerated on ``iat``/``exp``, in seconds (the daemon is both signer and verifier)."""

REASON_MALFORMED: Final = "malformed"
REASON_UNKNOWN_KEY: Final = "unknown key"
REASON_BAD_SIGNATURE: Final = "bad signature"
REASON_EXPIRED: Final = "expired"
REASON_NOT_YET_VALID: Final = "not yet valid"

_MAC_BYTES: Final = 32  # SHA-256 output
_KID_BYTES: Final = 6  # 8 base64url characters; kids name keys, they are not secret
_KID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
_MAX_TIME: Final = 2**53 - 1  # seconds; also the largest integer every JSON reader keeps exactly


@dataclass(frozen=True, slots=True)
class SessionClaims:
    """What an envelope binds: which session, for which project and workspace, in which mode, and when.

    ``project_id`` may be empty (a session opened without ``--project``); the other strings may not.
    ``iat`` and ``exp`` are Unix seconds with ``iat < exp``.
    """

    session_id: str
    project_id: str
    workspace: str
    mode: str
    iat: int
    exp: int


_CLAIM_KEYS: Final = frozenset(f.name for f in fields(SessionClaims))
_STR_CLAIMS: Final = ("session_id", "project_id", "workspace", "mode")
_MAY_BE_EMPTY: Final = frozenset({"project_id"})


class _Malformed(Exception):
    """Internal: the payload broke a structural rule. Never leaves this module."""


def _str_problem(name: str, value: object) -> str | None:
    if type(value) is not str:
        return f"{name} must be a string"
    if not value and name not in _MAY_BE_EMPTY:
        return f"{name} must not be empty"
    if len(value) > MAX_FIELD_CHARS:
        return f"{name} is longer than {MAX_FIELD_CHARS} characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, which json.loads lets through from "\ud800"
        return f"{name} is not valid Unicode"
    return None


def _time_problem(name: str, value: object) -> str | None:
    # SECURITY: bool is an int subclass; `true` is not a timestamp.
    if type(value) is not int:
        return f"{name} must be an integer"
    if not 0 <= value <= _MAX_TIME:
        return f"{name} is out of range"
    return None


def _claims_problem(claims: SessionClaims) -> str | None:
    """The first way ``claims`` breaks the structural rules, or ``None``. Shared by sign and verify."""
    for name in _STR_CLAIMS:
        if (problem := _str_problem(name, getattr(claims, name))) is not None:
            return problem
    for name in ("iat", "exp"):
        if (problem := _time_problem(name, getattr(claims, name))) is not None:
            return problem
    if claims.exp <= claims.iat:
        return "exp must be after iat"
    return None


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:  # SECURITY: json.loads would silently keep the last duplicate
            raise _Malformed
        obj[key] = value
    return obj


def _reject_constant(name: str) -> object:
    raise _Malformed  # SECURITY: NaN, Infinity and -Infinity are not JSON (RFC 8259 §6)


def _parse_claims(payload_b64: str) -> SessionClaims:
    """Strictly decode a payload whose MAC has already been verified; raise ``_Malformed``."""
    try:
        raw = b64url_decode(payload_b64)
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_object, parse_constant=_reject_constant)
    # SECURITY: json.loads raises RecursionError (not ValueError) on deep nesting; UnicodeError is a
    # ValueError but named so the intent survives refactoring.
    except (ValueError, UnicodeError, RecursionError, TypeError) as exc:
        raise _Malformed from exc
    if not isinstance(obj, dict) or obj.keys() != _CLAIM_KEYS:  # no unknown and no missing keys
        raise _Malformed
    claims = SessionClaims(**cast("dict[str, Any]", obj))  # types are checked on the next line
    if _claims_problem(claims) is not None:
        raise _Malformed
    # SECURITY: one spelling per payload: insignificant whitespace, key order or escape variants are
    # refused too, so a verified envelope is byte-for-byte what sign() produced.
    if canonical_json(asdict(claims)) != raw:
        raise _Malformed
    return claims


def _mac(key: bytes, signing_input: str) -> bytes:
    return hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()


class EnvelopeKeys:
    """MAC keys by kid, oldest first: the newest signs, every key still held verifies.

    Rotation follows the itsdangerous model: ``rotate()`` adds a key that signs from then on, envelopes
    signed with older keys keep verifying until ``retire()`` drops their key. Keys never leave this
    object and never appear in its ``repr``.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[tuple[str, bytes]]) -> None:
        """Hold ``(kid, key)`` pairs, oldest first; the last one signs. Raise ``ValueError`` if unfit."""
        self._keys: dict[str, bytes] = {}
        for kid, key in keys:
            self._add(kid, key)
        if not self._keys:
            raise ValueError("EnvelopeKeys needs at least one key")

    @classmethod
    def generate(cls) -> EnvelopeKeys:
        """A key set with one fresh random key."""
        return cls([(_new_kid(()), secrets.token_bytes(KEY_BYTES))])  # SECURITY: CSPRNG key

    def __repr__(self) -> str:
        return f"EnvelopeKeys(kids={list(self._keys)!r})"  # SECURITY: kids only, never key bytes

    @property
    def kids(self) -> tuple[str, ...]:
        """Known kids, oldest first."""
        return tuple(self._keys)

    @property
    def signing_kid(self) -> str:
        """The kid new envelopes are signed with."""
        return next(reversed(self._keys))

    def rotate(self) -> str:
        """Add a fresh key that signs from now on; return its kid. Older keys still verify."""
        kid = _new_kid(self._keys)
        self._add(kid, secrets.token_bytes(KEY_BYTES))  # SECURITY: CSPRNG key
        return kid

    def retire(self, kid: str) -> None:
        """Forget an old key: envelopes signed with it stop verifying. The signing key cannot be retired."""
        if kid not in self._keys:
            raise KeyError(kid)
        if kid == self.signing_kid:
            raise ValueError("cannot retire the signing key; rotate first")
        del self._keys[kid]

    def seal(self, purpose: str, data: bytes) -> bytes:
        """A MAC of ``data`` under the signing key's subkey for ``purpose`` (HKDF), never an envelope's MAC."""
        return hmac.new(self._subkey(self.signing_kid, purpose), data, hashlib.sha256).digest()

    def unsealed(self, purpose: str, data: bytes, mac: bytes, *, kid: str) -> bool:
        """Whether ``mac`` is ``seal(purpose, data)`` under key ``kid`` (False for an unknown kid)."""
        if kid not in self._keys:
            return False
        expected = hmac.new(self._subkey(kid, purpose), data, hashlib.sha256).digest()
        return hmac.compare_digest(expected, mac)  # SECURITY: constant time, bytes only

    def _subkey(self, kid: str, purpose: str) -> bytes:
        # SECURITY: a subkey per purpose (HKDF, RFC 5869), so a MAC made for a file can never pass as an
        # envelope's, and the other way round.
        info = b"sidecar subkey " + purpose.encode("ascii")
        return HKDF(algorithm=SHA256(), length=KEY_BYTES, salt=None, info=info).derive(self._keys[kid])

    def sign(self, claims: SessionClaims) -> str:
        """Serialise and MAC ``claims`` with the newest key. ``ValueError`` if verify would refuse them."""
        problem = _claims_problem(claims)
        if problem is not None:
            raise ValueError(f"cannot sign claims: {problem}")
        kid = self.signing_kid
        signing_input = f"{VERSION}.{kid}.{b64url_encode(canonical_json(asdict(claims)))}"
        envelope = f"{signing_input}.{b64url_encode(_mac(self._keys[kid], signing_input))}"
        if len(envelope) > MAX_ENVELOPE_CHARS:
            raise ValueError(f"cannot sign claims: envelope longer than {MAX_ENVELOPE_CHARS} characters")
        return envelope

    def verify(self, envelope: str, *, now: int, leeway: int = DEFAULT_LEEWAY) -> SessionClaims:
        """Return the claims of a genuine, current envelope; otherwise raise ``EnvelopeRejected``.

        ``now`` is Unix seconds. The checks run in the order given in the module docstring; nothing
        covered by the MAC is decoded before the MAC matches.
        """
        if leeway < 0:
            raise ValueError("leeway must not be negative")
        # SECURITY: bound the work and the alphabet before splitting anything.
        if not isinstance(envelope, str) or len(envelope) > MAX_ENVELOPE_CHARS or not envelope.isascii():
            raise EnvelopeRejected(REASON_MALFORMED)
        parts = envelope.split(".")
        if len(parts) != 4 or parts[0] != VERSION:
            raise EnvelopeRejected(REASON_MALFORMED)
        _, kid, payload_b64, mac_b64 = parts
        key = self._keys.get(kid)
        if key is None:
            raise EnvelopeRejected(REASON_UNKNOWN_KEY)
        try:
            # SECURITY: canonical and exactly 32 bytes, so two spellings of one MAC cannot both pass.
            mac = b64url_decode(mac_b64, max_len=_MAC_BYTES)
        except ValueError:
            raise EnvelopeRejected(REASON_MALFORMED) from None
        if len(mac) != _MAC_BYTES:
            raise EnvelopeRejected(REASON_MALFORMED)
        # SECURITY: MAC over the text as received, compared in constant time, before any parsing.
        if not hmac.compare_digest(mac, _mac(key, f"{VERSION}.{kid}.{payload_b64}")):
            raise EnvelopeRejected(REASON_BAD_SIGNATURE)
        try:
            claims = _parse_claims(payload_b64)
        except _Malformed:
            raise EnvelopeRejected(REASON_MALFORMED) from None
        # SECURITY: both bounds are required claims; a future iat is refused, not trusted.
        if claims.exp <= now - leeway:
            raise EnvelopeRejected(REASON_EXPIRED)
        if claims.iat > now + leeway:
            raise EnvelopeRejected(REASON_NOT_YET_VALID)
        return claims

    def _add(self, kid: str, key: bytes) -> None:
        if not isinstance(kid, str) or _KID_PATTERN.fullmatch(kid) is None:
            raise ValueError("kid must be 1-32 base64url characters")
        if kid in self._keys:
            raise ValueError(f"duplicate kid {kid!r}")
        if not isinstance(key, bytes) or len(key) < KEY_BYTES:
            # SECURITY: HMAC keys need real entropy (RFC 8725 §3.5).
            raise ValueError(f"key for kid {kid!r} must be at least {KEY_BYTES} bytes")
        self._keys[kid] = key


def _new_kid(taken: Iterable[str]) -> str:
    existing = set(taken)
    while True:
        kid = b64url_encode(secrets.token_bytes(_KID_BYTES))
        if kid not in existing:
            return kid
