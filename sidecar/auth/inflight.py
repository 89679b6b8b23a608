"""In-flight work, indexed by what may revoke it (a route, a session), so revocation can abort it all.

Every HTTP request on an authenticated route and every tool execution registers an abort callback
under the keys that can revoke it. ``abort(key)`` runs every callback under that key exactly once.
Callbacks must be cheap and must not raise (they close a transport or cancel a task).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager

__all__ = ["InflightTracker"]

logger = logging.getLogger(__name__)

Abort = Callable[[], None]


class InflightTracker:
    """A registry of abort callbacks keyed by revocable things (``("route", name)``, ``("session", id)``)."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, dict[int, Abort]] = {}
        self._next = 0

    @contextmanager
    def track(self, keys: Iterable[Hashable], abort: Abort) -> Iterator[None]:
        """Register ``abort`` under each key for the duration of the ``with`` block."""
        self._next += 1
        ticket = self._next
        keys = tuple(keys)
        for key in keys:
            self._by_key.setdefault(key, {})[ticket] = abort
        try:
            yield
        finally:
            for key in keys:
                entries = self._by_key.get(key)
                if entries is not None:
                    entries.pop(ticket, None)
                    if not entries:
                        del self._by_key[key]

    def abort(self, key: Hashable) -> int:
        """Abort everything registered under ``key``; return how many were aborted."""
        entries = self._by_key.pop(key, {})
        seen: set[int] = set()
        for ticket, callback in list(entries.items()):
            if ticket in seen:
                continue
            seen.add(ticket)
            try:
                callback()
            except Exception:  # one bad callback must not leave the rest running
                logger.exception("abort callback failed for %r", key)
        return len(seen)

    def count(self, key: Hashable) -> int:
        return len(self._by_key.get(key, {}))
