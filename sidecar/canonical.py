"""The one spelling of values that are hashed, MAC'd or stored as evidence: canonical JSON and UTC time.

``canonical_json`` is JSON with sorted keys, no whitespace (``,`` and ``:`` separators), ASCII only
(everything else as ``\\uXXXX``) and no NaN or Infinity: one byte string per value, whatever the dict
order or the characters, and never a lone-surrogate encoding error. Trust keys, tool fingerprints,
approval digests, session-envelope MACs and the audit chain hash these bytes, so they must never change:
stored approvals, envelopes and audit logs would stop matching.

``utc_timestamp`` is RFC 3339 in UTC with milliseconds (``2025-01-02T03:04:05.678Z``), as the trust
store and the audit log record it.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["canonical_json", "utc_timestamp"]

_ENCODER: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
"""The canonical form; one encoder for the process (``json.dumps`` builds one per call)."""


def canonical_json(value: object, *, default: Callable[[Any], Any] | None = None, allow_nan: bool = False) -> bytes:
    """``value`` as canonical JSON bytes; ``TypeError``/``ValueError`` if it is not plain JSON.

    ``default`` and ``allow_nan`` are for digests of untrusted input that must not fail (``default=str``
    spells an object by its ``str``, ``allow_nan`` writes ``NaN``); they change the bytes only for values
    that plain canonical JSON refuses.
    """
    if default is None and not allow_nan:
        return _ENCODER.encode(value).encode("ascii")
    encoder = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=allow_nan, default=default
    )
    return encoder.encode(value).encode("ascii")


def utc_timestamp(now: float | None = None) -> str:
    """``now`` (default: the current time, seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    now = time.time() if now is None else now
    second = int(now)
    return f"{_second(second)}.{int((now - second) * 1000):03d}Z"


@functools.lru_cache(maxsize=4)
def _second(second: int) -> str:
    """The date and time to the second (formatting it for every audit record cost more than the hash)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
