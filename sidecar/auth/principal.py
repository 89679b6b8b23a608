"""Who is calling: the route whose token was presented and the session whose envelope was verified."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCOPE_KEY", "Principal"]

SCOPE_KEY = "sidecar.principal"
"""Where the MCP bridge puts the principal in the ASGI scope, for the SDK handlers to read."""


@dataclass(frozen=True, slots=True)
class Principal:
    route: str
    generation: int
    session_id: str

    @property
    def owner_id(self) -> str:
        """The identity MCP transport sessions are bound to: one route token generation, one session."""
        return f"{self.route}#{self.generation}|{self.session_id}"
