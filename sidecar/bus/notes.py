"""Project notes: a small persistent notebook agents of one project share across sessions.

Backs three built-ins that show the risk levels end to end: ``notes_read`` (LOW), ``note_save``
(MEDIUM: a reversible side effect — asks in ``default`` mode), ``notes_clear`` (HIGH: irreversible, so
never exposed to an agent; the user deletes the file). One Markdown file per project under
``<data>/notes/``, named by a hash of the project id (ids may contain ``/`` and ``:``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Final

from sidecar.store.files import read_private, remove_quietly, write_atomic

__all__ = ["MAX_NOTE_CHARS", "NoteBook"]

MAX_NOTE_CHARS: Final = 4000
MAX_BOOK_BYTES: Final = 1024 * 1024
"""A project's notebook stops growing at 1 MiB (oldest entries are kept; new ones are refused)."""


class NoteBook:
    def __init__(self, root: Path) -> None:
        self._root = root

    def path(self, project_id: str) -> Path:
        digest = hashlib.sha256(project_id.encode()).hexdigest()[:24]
        return self._root / f"{digest}.md"

    def read(self, project_id: str) -> str:
        try:
            return read_private(self.path(project_id)).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def append(self, project_id: str, text: str, *, now: dt.datetime | None = None) -> int:
        """Add one dated entry; return the notebook's size in bytes."""
        text = text.strip()
        if not text:
            raise ValueError("the note is empty")
        if len(text) > MAX_NOTE_CHARS:
            raise ValueError(f"a note is at most {MAX_NOTE_CHARS} characters")
        current = self.read(project_id) or f"# Notes for project {project_id}\n"
        stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")
        updated = f"{current.rstrip()}\n\n## {stamp}\n\n{text}\n"
        data = updated.encode("utf-8")
        if len(data) > MAX_BOOK_BYTES:
            raise ValueError("this project's notebook is full (1 MiB); ask the user to prune it")
        write_atomic(self.path(project_id), data)
        return len(data)

    def clear(self, project_id: str) -> None:
        remove_quietly(self.path(project_id))
