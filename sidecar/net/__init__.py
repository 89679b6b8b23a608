"""The network guard (contract §3): pure Host/Origin/target checks and the thin middleware that applies them.

``hostcheck`` is plain Python (no aiohttp) and raises ``sidecar.errors`` classes; ``guard`` adapts it to
aiohttp and must be the first middleware after the error renderer.
"""

from __future__ import annotations

from sidecar.net.guard import make_guard_middleware
from sidecar.net.hostcheck import check_fetch_site, check_host, check_origin, check_target

__all__ = ["check_fetch_site", "check_host", "check_origin", "check_target", "make_guard_middleware"]
