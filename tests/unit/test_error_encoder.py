"""The JSON error bodies' encoder (contract §8): escaped, bounded, never sniffed as markup.

Over real sockets, every refusal's body is checked in ``tests/security/test_error_bodies.py``.
"""

from __future__ import annotations

import json

from sidecar.errors import RequestRejected
from sidecar.http import MAX_MESSAGE, error_json, error_response


def test_the_error_encoder_escapes_markup_and_everything_outside_printable_ascii() -> None:
    text = error_json({"error": {"message": "<script>&\x00\x1b\x7f\u202e\u2028é"}})
    assert text == ('{"error":{"message":"\\u003cscript\\u003e\\u0026\\u0000\\u001b\\u007f\\u202e\\u2028\\u00e9"}}')
    assert json.loads(text)["error"]["message"] == "<script>&\x00\x1b\x7f\u202e\u2028é"


def test_a_message_past_the_bound_is_cut() -> None:
    reply = error_response("/control/x", RequestRejected("y" * (3 * MAX_MESSAGE)))
    assert reply.text is not None
    message = json.loads(reply.text)["error"]["message"]
    assert len(message) == MAX_MESSAGE and message.endswith("...")
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
