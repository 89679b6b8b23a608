"""The session envelope: a genuine, current envelope verifies; every other input is EnvelopeRejected."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import string
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sidecar.auth.envelope as envelope_module
from sidecar.auth.encoding import b64url_decode, b64url_encode
from sidecar.auth.envelope import (
    MAX_ENVELOPE_CHARS,
    REASON_BAD_SIGNATURE,
    REASON_EXPIRED,
    REASON_MALFORMED,
    REASON_NOT_YET_VALID,
    REASON_UNKNOWN_KEY,
    EnvelopeKeys,
    SessionClaims,
)
from sidecar.errors import EnvelopeRejected, Forbidden

KEY = bytes(range(32))
KID = "testkid1"
OTHER_KEY = bytes(range(100, 132))
OTHER_KID = "otherkid"
NOW = 1_700_000_000
CLAIMS = SessionClaims(
    session_id="sess-1",
    project_id="proj-1",
    workspace="/home/user/project",
    mode="default",
    iat=NOW,
    exp=NOW + 3600,
)
KEYS = EnvelopeKeys([(KID, KEY)])
ENVELOPE = KEYS.sign(CLAIMS)


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def claims_dict(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "session_id": CLAIMS.session_id,
        "project_id": CLAIMS.project_id,
        "workspace": CLAIMS.workspace,
        "mode": CLAIMS.mode,
        "iat": CLAIMS.iat,
        "exp": CLAIMS.exp,
    }
    base.update(changes)
    return base


def sign_text(payload_b64: str, *, key: bytes = KEY, kid: str = KID) -> str:
    """MAC arbitrary payload text with a test key, the way an attacker holding the key could."""
    signing_input = f"v1.{kid}.{payload_b64}"
    mac = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url_encode(mac)}"


def sign_raw(payload: bytes, *, key: bytes = KEY, kid: str = KID) -> str:
    return sign_text(b64url_encode(payload), key=key, kid=kid)


def rejection(envelope: object, *, keys: EnvelopeKeys = KEYS, now: int = NOW) -> str:
    with pytest.raises(EnvelopeRejected) as info:
        keys.verify(envelope, now=now)  # type: ignore[arg-type]
    return str(info.value)


def with_part(envelope: str, index: int, value: str) -> str:
    parts = envelope.split(".")
    parts[index] = value
    return ".".join(parts)


def non_canonical_sibling(text: str) -> str:
    """Same bytes, different spelling: set unused trailing bits of the last character."""
    assert len(text) % 4 in (2, 3), "needs unused trailing bits"
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    sibling = text[:-1] + alphabet[alphabet.index(text[-1]) | 1]
    assert sibling != text
    padded = sibling + "=" * (-len(sibling) % 4)
    assert base64.urlsafe_b64decode(padded) == b64url_decode(text)  # what a lax decoder would accept
    return sibling


# --- the good path ---------------------------------------------------------------------------------------


def test_signed_claims_verify_back_to_the_same_claims() -> None:
    assert KEYS.verify(ENVELOPE, now=NOW) == CLAIMS


def test_envelope_is_v1_kid_payload_mac_with_the_mac_over_the_text_as_sent() -> None:
    version, kid, payload_b64, mac_b64 = ENVELOPE.split(".")
    assert (version, kid) == ("v1", KID)
    assert b64url_decode(payload_b64) == canonical(claims_dict())
    expected = hmac.new(KEY, f"v1.{KID}.{payload_b64}".encode("ascii"), hashlib.sha256).digest()
    assert b64url_decode(mac_b64) == expected
    assert sign_raw(canonical(claims_dict())) == ENVELOPE


def test_empty_project_id_and_non_ascii_workspace_round_trip() -> None:
    claims = replace(CLAIMS, project_id="", workspace="/home/j\u00fcrgen/\u30d7\u30ed\u30b8\u30a7\u30af\u30c8")
    envelope = KEYS.sign(claims)
    assert envelope.isascii()
    assert KEYS.verify(envelope, now=NOW) == claims


def test_envelope_of_exactly_the_length_cap_verifies() -> None:
    for extra in range(4000):
        envelope = KEYS.sign(replace(CLAIMS, workspace="w" * (1 + extra)))
        if len(envelope) >= MAX_ENVELOPE_CHARS:
            break
    assert len(envelope) == MAX_ENVELOPE_CHARS
    assert KEYS.verify(envelope, now=NOW).workspace.startswith("w")


# --- rejections before the MAC -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "envelope",
    [
        "",
        "v1",
        ENVELOPE + ".extra",  # a fifth part
        ENVELOPE.rsplit(".", 1)[0],  # no mac part
        "v2" + ENVELOPE[2:],
        "V1" + ENVELOPE[2:],
        "v1 " + ENVELOPE[2:],
        ENVELOPE + "\u00e9",  # non-ASCII
        "\uff56" + ENVELOPE[1:],  # fullwidth v
        ENVELOPE + "A" * (MAX_ENVELOPE_CHARS - len(ENVELOPE) + 1),  # over the cap
        " " + ENVELOPE,
        ENVELOPE + "\n",
    ],
)
def test_malformed_framing_is_rejected(envelope: str) -> None:
    assert rejection(envelope) == REASON_MALFORMED


@pytest.mark.parametrize("value", [None, b"v1.a.b.c", 42])
def test_non_str_envelope_is_rejected(value: object) -> None:
    assert rejection(value) == REASON_MALFORMED


def test_validly_signed_envelope_over_the_cap_is_rejected() -> None:
    envelope = sign_raw(canonical(claims_dict(workspace="w" * MAX_ENVELOPE_CHARS)))
    assert len(envelope) > MAX_ENVELOPE_CHARS
    assert rejection(envelope) == REASON_MALFORMED


def test_unknown_kid_is_rejected_before_the_mac_is_looked_at() -> None:
    assert rejection(with_part(ENVELOPE, 1, "nosuchid")) == REASON_UNKNOWN_KEY
    assert rejection(sign_raw(canonical(claims_dict()), kid="nosuchid")) == REASON_UNKNOWN_KEY
    assert rejection("v1.nosuchid.!!!.!!!") == REASON_UNKNOWN_KEY
    assert rejection(with_part(ENVELOPE, 1, "")) == REASON_UNKNOWN_KEY


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_mac_of_the_wrong_length_is_rejected(length: int) -> None:
    assert rejection(with_part(ENVELOPE, 3, b64url_encode(bytes(length)))) == REASON_MALFORMED


MAC_SPELLINGS: dict[str, Callable[[str], str]] = {
    "one pad": lambda mac: mac + "=",
    "two pads": lambda mac: mac + "==",
    "standard alphabet": lambda mac: "+/" + mac[2:],
    "truncated": lambda mac: mac[:-1],
    "leading space": lambda mac: " " + mac,
    "trailing newline": lambda mac: mac + "\n",
}


@pytest.mark.parametrize("spelling", MAC_SPELLINGS.values(), ids=MAC_SPELLINGS.keys())
def test_mac_in_any_non_canonical_spelling_is_rejected(spelling: Callable[[str], str]) -> None:
    mac = ENVELOPE.split(".")[3]
    assert rejection(with_part(ENVELOPE, 3, spelling(mac))) == REASON_MALFORMED


def test_mac_with_non_zero_trailing_bits_is_rejected_although_its_bytes_match() -> None:
    mac = ENVELOPE.split(".")[3]
    assert len(mac) == 43  # 256 bits in 258: two unused bits
    assert rejection(with_part(ENVELOPE, 3, non_canonical_sibling(mac))) == REASON_MALFORMED


# --- the MAC -----------------------------------------------------------------------------------------------


def test_tampered_payload_byte_fails_the_signature() -> None:
    payload = bytearray(canonical(claims_dict()))
    payload[payload.index(b"default")] ^= 0x01
    assert rejection(with_part(ENVELOPE, 2, b64url_encode(bytes(payload)))) == REASON_BAD_SIGNATURE


def test_changed_claim_fails_the_signature() -> None:
    forged = b64url_encode(canonical(claims_dict(mode="bypass")))
    assert rejection(with_part(ENVELOPE, 2, forged)) == REASON_BAD_SIGNATURE


def test_tampered_mac_fails_the_signature() -> None:
    mac = bytearray(b64url_decode(ENVELOPE.split(".")[3]))
    mac[0] ^= 0x80
    assert rejection(with_part(ENVELOPE, 3, b64url_encode(bytes(mac)))) == REASON_BAD_SIGNATURE


def test_swapped_kid_fails_the_signature() -> None:
    keys = EnvelopeKeys([(KID, KEY), (OTHER_KID, OTHER_KEY)])
    envelope = keys.sign(CLAIMS)
    assert envelope.split(".")[1] == OTHER_KID
    assert keys.verify(envelope, now=NOW) == CLAIMS
    assert rejection(with_part(envelope, 1, KID), keys=keys) == REASON_BAD_SIGNATURE
    assert rejection(with_part(ENVELOPE, 1, OTHER_KID), keys=keys) == REASON_BAD_SIGNATURE


def test_envelope_signed_with_another_key_fails_the_signature() -> None:
    assert rejection(sign_raw(canonical(claims_dict()), key=OTHER_KEY)) == REASON_BAD_SIGNATURE


def test_padding_added_to_the_payload_fails_the_signature() -> None:
    payload_b64 = ENVELOPE.split(".")[2]
    assert rejection(with_part(ENVELOPE, 2, payload_b64 + "=")) == REASON_BAD_SIGNATURE


def test_garbage_payload_under_a_bad_mac_is_a_bad_signature_not_malformed() -> None:
    # The MAC is checked before the payload is decoded, so the payload's shape never shows.
    assert rejection(with_part(ENVELOPE, 2, "!!not base64!!")) == REASON_BAD_SIGNATURE
    assert rejection(with_part(ENVELOPE, 2, "")) == REASON_BAD_SIGNATURE


def test_payload_is_not_parsed_when_the_mac_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_parse(payload_b64: str) -> SessionClaims:
        raise AssertionError("payload parsed before the MAC was verified")

    monkeypatch.setattr(envelope_module, "_parse_claims", must_not_parse)
    assert rejection(with_part(ENVELOPE, 2, b64url_encode(b"{}"))) == REASON_BAD_SIGNATURE


def test_non_canonical_payload_spelling_fails_the_signature_when_not_resigned() -> None:
    payload_b64 = b64url_encode(canonical(claims_dict(mode="default!")))  # length with unused bits
    envelope = sign_text(payload_b64)
    assert KEYS.verify(envelope, now=NOW).mode == "default!"
    assert rejection(with_part(envelope, 2, non_canonical_sibling(payload_b64))) == REASON_BAD_SIGNATURE


# --- strict parsing of a correctly signed payload ---------------------------------------------------------


def test_non_canonical_payload_spelling_is_rejected_even_with_a_valid_signature() -> None:
    payload_b64 = b64url_encode(canonical(claims_dict(mode="default!")))
    assert rejection(sign_text(non_canonical_sibling(payload_b64))) == REASON_MALFORMED


@pytest.mark.parametrize(
    "payload_b64",
    [
        b64url_encode(canonical(claims_dict())) + "=",
        b64url_encode(canonical(claims_dict())) + "==",
        "+" + b64url_encode(canonical(claims_dict()))[1:],
        "",
        "A",
    ],
)
def test_payload_not_in_canonical_base64url_is_rejected_even_with_a_valid_signature(payload_b64: str) -> None:
    assert rejection(sign_text(payload_b64)) == REASON_MALFORMED


def with_literal(name: str, literal: bytes) -> bytes:
    """The canonical payload with one claim's value replaced by raw JSON text."""
    marker = "\x00marker\x00"
    return canonical(claims_dict(**{name: marker})).replace(b'"\\u0000marker\\u0000"', literal)


DEEP = b'{"exp":' + b"[" * 1400 + b"]" * 1400 + b"}"

SIGNED_BAD_PAYLOADS: dict[str, bytes] = {
    "duplicate key, last wins in json.loads": (
        b'{"exp":%d,"iat":%d,"mode":"read-only","mode":"bypass","project_id":"p","session_id":"s",'
        b'"workspace":"/w"}' % (NOW + 60, NOW)
    ),
    "duplicate key, same value": canonical(claims_dict())[:-1] + b',"mode":"default"}',
    "unknown key": canonical(claims_dict(admin=True)),
    "unknown key instead of a known one": canonical({k: v for k, v in claims_dict(scope="all").items() if k != "mode"}),
    "missing key": canonical({k: v for k, v in claims_dict().items() if k != "exp"}),
    "no keys": b"{}",
    "bool as iat": canonical(claims_dict(iat=True)),
    "bool as exp": canonical(claims_dict(exp=True, iat=0)),
    "float iat": canonical(claims_dict(iat=float(NOW))),
    "string exp": canonical(claims_dict(exp=str(NOW + 60))),
    "null exp": canonical(claims_dict(exp=None)),
    "NaN exp": with_literal("exp", b"NaN"),
    "Infinity exp": with_literal("exp", b"Infinity"),
    "-Infinity iat": with_literal("iat", b"-Infinity"),
    "negative iat": canonical(claims_dict(iat=-1)),
    "exp beyond 2**53": canonical(claims_dict(exp=2**53)),
    "int with 2000 digits": with_literal("exp", b"9" * 2000),
    "exp equal to iat": canonical(claims_dict(exp=NOW)),
    "exp before iat": canonical(claims_dict(exp=NOW - 1)),
    "number as session_id": canonical(claims_dict(session_id=7)),
    "list as mode": canonical(claims_dict(mode=["default"])),
    "object as workspace": canonical(claims_dict(workspace={"path": "/w"})),
    "empty session_id": canonical(claims_dict(session_id="")),
    "empty mode": canonical(claims_dict(mode="")),
    "empty workspace": canonical(claims_dict(workspace="")),
    "lone surrogate": canonical(claims_dict(workspace="/w/\ud800")),
    "array": b"[]",
    "string": b'"claims"',
    "null": b"null",
    "number": b"1",
    "empty": b"",
    "not JSON": b"claims",
    "trailing data": canonical(claims_dict()) + b"{}",
    "whitespace between tokens": json.dumps(claims_dict(), sort_keys=True).encode(),
    "keys out of order": json.dumps(claims_dict(), separators=(",", ":")).encode(),
    "escaped ASCII": canonical(claims_dict()).replace(b'"default"', b'"\\u0064efault"'),
    "raw UTF-8 instead of escapes": canonical(claims_dict(workspace="/j\u00fcrgen")).replace(
        b"\\u00fc", "\u00fc".encode()
    ),
    "invalid UTF-8": canonical(claims_dict()).replace(b"default", b"def\xffult"),
    "UTF-8 BOM": b"\xef\xbb\xbf" + canonical(claims_dict()),
    "deep nesting": DEEP,
}


@pytest.mark.parametrize("payload", SIGNED_BAD_PAYLOADS.values(), ids=SIGNED_BAD_PAYLOADS.keys())
def test_correctly_signed_but_malformed_payload_is_rejected(payload: bytes) -> None:
    envelope = sign_raw(payload)
    if len(envelope) > MAX_ENVELOPE_CHARS:
        pytest.fail("test payload too long to reach the parser")
    assert rejection(envelope) == REASON_MALFORMED


def test_deep_nesting_would_raise_recursion_error_in_plain_json_loads() -> None:
    with pytest.raises(RecursionError):
        json.loads(DEEP)
    assert rejection(sign_raw(DEEP)) == REASON_MALFORMED


def test_session_id_over_the_field_cap_is_refused_by_sign() -> None:
    with pytest.raises(ValueError, match="session_id"):
        KEYS.sign(replace(CLAIMS, session_id="s" * 4097))


# --- time -------------------------------------------------------------------------------------------------


def test_expired_envelope_is_rejected_after_the_leeway() -> None:
    envelope = KEYS.sign(replace(CLAIMS, iat=NOW - 3600, exp=NOW))
    assert KEYS.verify(envelope, now=NOW + 29) is not None
    assert rejection(envelope, now=NOW + 30) == REASON_EXPIRED
    assert rejection(envelope, now=NOW + 10_000) == REASON_EXPIRED
    with pytest.raises(EnvelopeRejected, match=REASON_EXPIRED):
        KEYS.verify(envelope, now=NOW + 1, leeway=0)


def test_envelope_issued_in_the_future_is_rejected_after_the_leeway() -> None:
    envelope = KEYS.sign(replace(CLAIMS, iat=NOW + 30, exp=NOW + 3600))
    assert KEYS.verify(envelope, now=NOW).iat == NOW + 30
    assert rejection(envelope, now=NOW - 1) == REASON_NOT_YET_VALID
    with pytest.raises(EnvelopeRejected, match=REASON_NOT_YET_VALID):
        KEYS.verify(envelope, now=NOW, leeway=0)


def test_negative_leeway_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="leeway"):
        KEYS.verify(ENVELOPE, now=NOW, leeway=-1)


# --- sign refuses claims verify would refuse ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"session_id": ""}, "session_id"),
        ({"mode": ""}, "mode"),
        ({"workspace": ""}, "workspace"),
        ({"workspace": "/w/\ud800"}, "workspace"),
        ({"iat": True}, "iat"),
        ({"exp": 1.5}, "exp"),
        ({"iat": -1}, "iat"),
        ({"exp": NOW}, "exp"),
        ({"session_id": 7}, "session_id"),
    ],
)
def test_sign_refuses_invalid_claims(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KEYS.sign(replace(CLAIMS, **changes))  # type: ignore[arg-type]


def test_sign_refuses_claims_whose_envelope_would_be_over_the_cap() -> None:
    long = replace(CLAIMS, session_id="s" * 1500, workspace="w" * 1500)
    with pytest.raises(ValueError, match="longer than"):
        KEYS.sign(long)


# --- keys and rotation -------------------------------------------------------------------------------------


def test_rotation_signs_with_the_new_kid_and_still_verifies_the_old_one() -> None:
    keys = EnvelopeKeys.generate()
    old_kid = keys.signing_kid
    old = keys.sign(CLAIMS)
    new_kid = keys.rotate()
    assert new_kid != old_kid
    assert keys.signing_kid == new_kid
    assert keys.kids == (old_kid, new_kid)
    new = keys.sign(CLAIMS)
    assert new.split(".")[1] == new_kid
    assert old.split(".")[1] == old_kid
    assert keys.verify(old, now=NOW) == keys.verify(new, now=NOW) == CLAIMS


def test_retired_key_no_longer_verifies_and_the_signing_key_cannot_be_retired() -> None:
    keys = EnvelopeKeys.generate()
    old_kid = keys.signing_kid
    old = keys.sign(CLAIMS)
    keys.rotate()
    keys.retire(old_kid)
    assert rejection(old, keys=keys) == REASON_UNKNOWN_KEY
    with pytest.raises(ValueError, match="signing key"):
        keys.retire(keys.signing_kid)
    with pytest.raises(KeyError):
        keys.retire(old_kid)


def test_generated_keys_are_independent_with_short_base64url_kids() -> None:
    first, second = EnvelopeKeys.generate(), EnvelopeKeys.generate()
    assert len(first.signing_kid) == 8
    assert len(b64url_decode(first.signing_kid)) == 6
    assert first.signing_kid != second.signing_kid
    assert rejection(first.sign(CLAIMS), keys=second) == REASON_UNKNOWN_KEY
    forged = with_part(second.sign(CLAIMS), 1, first.signing_kid)
    assert rejection(forged, keys=first) == REASON_BAD_SIGNATURE


def test_repr_names_kids_but_never_keys() -> None:
    text = repr(KEYS)
    assert KID in text
    assert KEY.hex() not in text
    assert repr(KEY) not in text
    assert b64url_encode(KEY) not in text


@pytest.mark.parametrize(
    ("pairs", "match"),
    [
        ([], "at least one"),
        ([(KID, bytes(31))], "at least 32 bytes"),
        ([(KID, "k" * 32)], "at least 32 bytes"),
        ([("has.dot", KEY)], "kid"),
        (([("", KEY)]), "kid"),
        ([("k" * 33, KEY)], "kid"),
        ([(KID, KEY), (KID, OTHER_KEY)], "duplicate"),
    ],
)
def test_unfit_keys_are_refused(pairs: list[tuple[str, bytes]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EnvelopeKeys(pairs)


def test_envelope_rejected_is_a_403() -> None:
    err = EnvelopeRejected(REASON_MALFORMED)
    assert isinstance(err, Forbidden)
    assert err.status == 403


# --- properties ------------------------------------------------------------------------------------------


@given(st.text(max_size=300))
def test_arbitrary_text_is_never_anything_but_rejected(text: str) -> None:
    with pytest.raises(EnvelopeRejected):
        KEYS.verify(text, now=NOW)


@given(st.text(alphabet=string.ascii_letters + string.digits + "-_.=+/ ", max_size=200))
def test_arbitrary_text_after_a_known_kid_is_never_anything_but_rejected(tail: str) -> None:
    with pytest.raises(EnvelopeRejected):
        KEYS.verify(f"v1.{KID}.{tail}", now=NOW)


@given(st.binary(max_size=600))
def test_arbitrary_signed_bytes_verify_or_are_rejected(payload: bytes) -> None:
    try:
        claims = KEYS.verify(sign_raw(payload), now=NOW)
    except EnvelopeRejected:
        return
    assert KEYS.sign(claims) == sign_raw(payload)  # only the exact canonical payload gets through


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from([*claims_dict(), "extra"]), JSON_VALUES, max_size=7))
def test_arbitrary_signed_json_objects_verify_only_when_exactly_canonical(obj: dict[str, object]) -> None:
    payload = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    envelope = sign_raw(payload)
    try:
        claims = KEYS.verify(envelope, now=NOW)
    except EnvelopeRejected:
        return
    assert KEYS.sign(claims) == envelope


@given(st.data())
def test_any_single_character_changed_is_rejected(data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(ENVELOPE) - 1))
    char = data.draw(st.characters().filter(lambda c: c != ENVELOPE[index]))
    with pytest.raises(EnvelopeRejected):
        KEYS.verify(ENVELOPE[:index] + char + ENVELOPE[index + 1 :], now=NOW)


@given(st.data())
def test_any_single_character_changed_to_base64url_or_dot_is_rejected(data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(ENVELOPE) - 1))
    alphabet = string.ascii_letters + string.digits + "-_."
    char = data.draw(st.sampled_from(alphabet).filter(lambda c: c != ENVELOPE[index]))
    with pytest.raises(EnvelopeRejected):
        KEYS.verify(ENVELOPE[:index] + char + ENVELOPE[index + 1 :], now=NOW)


@given(st.data())
def test_any_single_character_removed_or_inserted_is_rejected(data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(ENVELOPE)))
    if data.draw(st.booleans()) and index < len(ENVELOPE):
        changed = ENVELOPE[:index] + ENVELOPE[index + 1 :]
    else:
        changed = ENVELOPE[:index] + data.draw(st.characters()) + ENVELOPE[index:]
    with pytest.raises(EnvelopeRejected):
        KEYS.verify(changed, now=NOW)
