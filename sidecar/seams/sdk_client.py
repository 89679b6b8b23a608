"""What the connectors' raw call needs of the SDK's ``ClientSession``: its request stamp and its dispatcher.

``ClientSession._stamp(data, opts)`` adds the negotiated era's headers and ``_meta`` to a request exactly as
``call_tool`` does; ``ClientSession._dispatcher`` sends a request whose result comes back as the raw dict the
connector sent (``call_tool`` would parse it into a model and the bus would dump it again).
"""

from __future__ import annotations

from typing import Any

from mcp import ClientSession
from mcp.shared.dispatcher import CallOptions, Dispatcher

__all__ = ["client_dispatcher", "stamp_request"]


def stamp_request(client: ClientSession, data: dict[str, Any], opts: CallOptions) -> None:
    """Add the era's headers and ``_meta`` to ``data`` and ``opts``, as the client's own calls do."""
    client._stamp(data, opts)


def client_dispatcher(client: ClientSession) -> Dispatcher[Any]:
    """The connected client's dispatcher, which sends a request and answers its raw result."""
    return client._dispatcher  # type: ignore[no-any-return]
