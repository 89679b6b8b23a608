"""aiohttp's per-connection protocol, as the daemon's own connection handler needs it.

aiohttp (pinned exactly) offers no public way to choose the ``RequestHandler`` class a server makes per
connection, nor to read how far a connection's parser has got. Reached here: ``RequestHandler``'s
``_loop``, ``_request_count``, ``_request_in_progress`` and ``_messages``; ``web.Server``'s ``_loop``
and ``_kwargs``; ``web.AppRunner._make_server`` (overridden), whose server's class is swapped for one
whose ``__call__`` makes our handler (it changes nothing else). ``tests/unit/test_seams.py`` checks each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["ConnectionHandler", "HandlerRunner"]


class ConnectionHandler(RequestHandler):  # type: ignore[misc]
    """aiohttp's connection handler, with what a subclass reads of its parser's progress named."""

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop  # type: ignore[no-any-return]

    @property
    def requests_parsed(self) -> int:
        """Requests whose head the parser has completed on this connection, so far."""
        return self._request_count  # type: ignore[no-any-return]

    @property
    def busy(self) -> bool:
        """A request is being handled, or parsed requests wait for their turn."""
        return bool(self._request_in_progress or self._messages)


class _Server(web.Server):
    handler_class: type[ConnectionHandler] = ConnectionHandler
    configure: Callable[[ConnectionHandler], None] | None = None

    def __call__(self) -> RequestHandler:
        handler = self.handler_class(self, loop=self._loop, **self._kwargs)
        if self.configure is not None:
            self.configure(handler)
        return handler


class HandlerRunner(web.AppRunner):
    """``web.AppRunner`` whose server handles each connection with ``handler_class``, then ``configure``."""

    def __init__(
        self,
        app: web.Application,
        *,
        handler_class: type[ConnectionHandler],
        configure: Callable[[ConnectionHandler], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._handler_class = handler_class
        self._configure = configure

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The Server is built by Application._make_handler; swapping its class only changes which
        # RequestHandler it creates per connection.
        server.__class__ = _Server
        ours = server if isinstance(server, _Server) else None
        if ours is None:
            raise TypeError("aiohttp's server class could not be swapped")
        ours.handler_class = self._handler_class
        ours.configure = self._configure
        return server
