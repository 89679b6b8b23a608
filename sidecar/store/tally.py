"""Refusals counted, not recorded one by one: one audit record per key per window.

Whatever an unauthenticated party can cause at will (a connection from another account, a request
without a valid credential) must not write to disk once per event, or a flood fills the disk and buries
the audit log's real records. ``AuditTally`` counts such events by a key (a uid, a route) and a reason,
and writes one record per key when its window closes (or at ``close``): the count, the reasons with
theirs, and when the first came.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from sidecar.canonical import utc_timestamp

__all__ = ["WINDOW", "AuditAppend", "AuditTally"]

logger = logging.getLogger(__name__)

WINDOW: Final = 60.0
"""Seconds a key's events are gathered before their one record is written."""


class AuditAppend(Protocol):
    def __call__(self, event: str, /, **fields: Any) -> object: ...


@dataclass
class _Window:
    since: str
    reasons: Counter[str] = field(default_factory=Counter)


class AuditTally:
    """Counts ``event``s by ``key_name`` and reason; one audit record per key per ``window`` seconds."""

    def __init__(self, audit: AuditAppend, event: str, *, key_name: str, window: float = WINDOW) -> None:
        self._audit = audit
        self._event = event
        self._key_name = key_name
        self._window = window
        self._pending: dict[object, _Window] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.total: Counter[str] = Counter()
        """Events since start, by reason (for ``sidecar status``)."""

    @property
    def window(self) -> float:
        return self._window

    def count(self, key: object, reason: str) -> bool:
        """Count one event; True when it is the key's first in this window (worth one log line)."""
        self.total[reason] += 1
        window = self._pending.get(key)
        first = window is None
        if window is None:
            window = self._pending[key] = _Window(since=utc_timestamp())
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._window, self._flush_window)
        window.reasons[reason] += 1
        return first

    def _flush_window(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Write one record per key counted since the last flush."""
        pending, self._pending = self._pending, {}
        for key, window in pending.items():
            fields = {
                self._key_name: key,
                "count": window.reasons.total(),
                "reasons": dict(sorted(window.reasons.items())),
                "since": window.since,
            }
            try:
                self._audit(self._event, **fields)
            except Exception as exc:  # a full disk must not take the refusing path down with it
                logger.error("cannot audit %d %s events of %s: %s", window.reasons.total(), self._event, key, exc)

    def close(self) -> None:
        """Write what is pending and stop the timer (the audit log closes after this)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
