"""The one place that reaches into a dependency's private names.

A name beginning with ``_`` in ``mcp``, ``aiohttp`` or ``asyncio`` carries no compatibility promise (the
SDK's ``VERSIONING.md`` says so of its own), so an upgrade may move it without a word. Each module here
wraps what it reaches behind a small function or class named for what it does for us, and says which
names it uses; ``tests/unit/test_seams.py`` checks every one of them exists and behaves as relied upon,
so an upgrade fails there first; ``tests/test_architecture.py`` fails a private name of a dependency used
anywhere else. ``mcp`` and ``aiohttp`` are pinned exactly; ``docs/design.md`` has the upgrade procedure.

This package imports nothing of sidecar's: it is the lowest layer.
"""
