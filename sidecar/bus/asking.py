"""Asking a human: the question a call puts, the answers it can get, and who can put it.

``Asker`` is the seam: the MCP layer supplies one built on elicitation when the client supports it;
without one (REST, 2026-07-28 clients, JSON-response mode, clients without elicitation) the call leaves
a pending approval instead. An asker that fails counts as "could not ask": the call stays unapproved.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Answer", "Asker", "Question"]


@dataclass(frozen=True, slots=True)
class Question:
    tool: str
    kind: str
    group: str | None
    message: str

    @property
    def rememberable(self) -> bool:
        return self.group is not None


class Answer(enum.StrEnum):
    ACCEPT = "accept"
    ACCEPT_REMEMBER = "accept-remember"
    DECLINE = "decline"
    CANCEL = "cancel"


class Asker(Protocol):
    async def __call__(self, question: Question) -> Answer: ...
