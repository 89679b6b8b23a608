"""The last failure of each connector: which session's process failed, when, why, and its last stderr lines.

A connector that crashes, fails to start or exits in the middle of a call usually says why on stderr (a
traceback, a missing module, a bad token). The process keeps a bounded tail of its stderr; when the pool
or the relay learns that a process died on its own, it calls ``FailureLog.record``, which keeps the last
``SHOWN_LINES`` lines of that tail with the session and the time, and logs them in one WARNING record.
``sidecar connectors show <id>`` (``GET /control/connectors/<id>``) shows the connector's latest.

What is kept is the connector's own output, never its launch environment or anything sidecar holds. It is
untrusted text, so each line is escaped (control characters, bidi controls) and cut at ``LINE_CHARS``
before it is kept, logged or shown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sidecar.canonical import utc_timestamp
from sidecar.text import preview

__all__ = ["LINE_CHARS", "SHOWN_LINES", "Failure", "FailureLog"]

logger = logging.getLogger(__name__)

SHOWN_LINES: Final = 20
"""stderr lines kept per failure: the end of a traceback, without flooding a terminal or the log."""
LINE_CHARS: Final = 300
"""Longest stderr line kept (after escaping); a longer one is cut and ends ``...``."""
_REASON_CHARS: Final = 200
"""Longest reason kept (``exited with code 3``, ``failed to start: …``)."""
_MAX_CONNECTORS: Final = 256
"""Connectors whose last failure is remembered; the oldest record goes first beyond this."""


@dataclass(frozen=True, slots=True)
class Failure:
    """One process of a connector that ended without sidecar asking it to."""

    connector_id: str
    session_id: str
    """The sidecar session whose process it was (``probe:<id>`` for the probe when trusting)."""
    at: str
    """When the failure was noticed, RFC 3339 UTC."""
    reason: str
    stderr: tuple[str, ...]
    """Its last stderr lines, oldest first, each escaped and at most ``LINE_CHARS`` characters."""

    def public(self) -> dict[str, object]:
        """What the control API shows."""
        return {"session_id": self.session_id, "at": self.at, "reason": self.reason, "stderr": list(self.stderr)}


class FailureLog:
    """The latest ``Failure`` of each connector, in memory: it lives as long as the daemon."""

    def __init__(self) -> None:
        self._last: dict[str, Failure] = {}

    def record(self, connector_id: str, session_id: str, *, reason: str, stderr: Sequence[str]) -> Failure:
        """Keep this failure as ``connector_id``'s latest and log it (one WARNING record, bounded)."""
        failure = Failure(
            connector_id=connector_id,
            session_id=session_id,
            at=utc_timestamp(),
            reason=preview(reason, _REASON_CHARS, quote=False),
            stderr=tuple(preview(line, LINE_CHARS, quote=False) for line in stderr[-SHOWN_LINES:]),
        )
        self._last.pop(connector_id, None)  # re-insert: the dict's order is the order of the failures
        self._last[connector_id] = failure
        while len(self._last) > _MAX_CONNECTORS:
            del self._last[next(iter(self._last))]
        shown = "".join(f"\n  | {line}" for line in failure.stderr) if failure.stderr else " (none)"
        logger.warning(
            "connector %s (session %s) failed: %s; its last stderr lines:%s",
            connector_id,
            session_id,
            failure.reason,
            shown,
        )
        return failure

    def last(self, connector_id: str) -> Failure | None:
        """``connector_id``'s latest failure, or ``None`` if none of its processes has failed."""
        return self._last.get(connector_id)
