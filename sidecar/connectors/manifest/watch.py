"""Live connector config: the sources are re-read when a file under them changes, without a restart.

``watchfiles`` (inotify on Linux, FSEvents on macOS) reports changes under the user's config directory
(``mcp.json``), the plugins directory and every package directory; a burst of changes (an editor's
save, an atomic rename, a package copied in) is debounced into one re-read. A source file that is
briefly missing (deleted, then written again) gets a short grace before its connectors are withdrawn.

The watcher only makes changes take effect sooner. It can miss an event (a directory created after it
started, a filesystem without notifications), so trust never depends on it: every spawn checks the
connector against the disk again (``ConnectorManager.admit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Final

from watchfiles import awatch

__all__ = ["DEBOUNCE_MS", "MISSING_GRACE", "ConfigWatcher"]

logger = logging.getLogger(__name__)

DEBOUNCE_MS: Final = 200
"""Quiet time (milliseconds) that ends a burst of changes; well inside the 2 s a user waits for an edit."""
MISSING_GRACE: Final = 1.0
"""Seconds a source file that vanished gets to come back before its connectors are withdrawn."""
_STEP_MS: Final = 50
_RESTART_PAUSE: Final = 1.0
"""Seconds before watching again after the watcher itself failed (a directory removed, say)."""


class ConfigWatcher:
    """Calls ``refresh`` after files under ``directories`` change; ``run()`` is its lifetime."""

    def __init__(
        self,
        *,
        directories: Iterable[Path],
        refresh: Callable[[], None],
        sources: Callable[[], Iterable[Path]],
    ) -> None:
        """``sources``: the files the current connectors came from (a vanished one gets a grace)."""
        self._directories = tuple(directories)
        self._refresh = refresh
        self._sources = sources
        self.refreshes = 0
        """How many re-reads the watcher caused (tests and ``sidecar status`` can tell it works)."""

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(self._watch(stop), name="connector-config-watcher")
        try:
            yield
        finally:
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            watched = [str(d) for d in self._directories if d.is_dir()]
            if not watched:
                return
            try:
                async for _ in awatch(*watched, debounce=DEBOUNCE_MS, step=_STEP_MS, stop_event=stop, recursive=True):
                    await self._changed()
            except Exception:
                logger.exception("connector config watcher failed; watching again")
                await asyncio.sleep(_RESTART_PAUSE)

    async def _changed(self) -> None:
        known = set(self._sources())
        if any(not path.exists() for path in known):
            await asyncio.sleep(MISSING_GRACE)  # an editor or tool may be replacing it in two steps
        try:
            self._refresh()
        except Exception:
            logger.exception("re-reading the connector config failed; the last good config stays in force")
        self.refreshes += 1
