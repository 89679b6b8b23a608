"""Typed application state (``web.AppKey``): every key, in one module.

``app.py`` fills them; handler modules import them from here, which keeps imports one-way
(``app`` → handlers → ``appkeys``) instead of handlers importing the composition root.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

from aiohttp import web

from sidecar.auth.console import ConsoleSignIn
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.persist import StateJournal
from sidecar.auth.process_credentials import ProcessCredentials
from sidecar.auth.routes import RouteRegistry
from sidecar.auth.sessions import SessionStore
from sidecar.bus.approvals import ApprovalStore
from sidecar.bus.billing import BillingGate
from sidecar.bus.registry import ToolRegistry
from sidecar.bus.tools import ToolService
from sidecar.config import Settings
from sidecar.connectors.service import ConnectorService
from sidecar.edge.endpoint import McpEndpoint
from sidecar.edge.internal import InternalApi
from sidecar.edge.mcp import ChangeHub
from sidecar.edge.rest import RestFacade
from sidecar.net.frontdoor import FrontDoor
from sidecar.oauth.broker import Broker
from sidecar.paths import Paths
from sidecar.store.audit import AuditLog
from sidecar.store.auditverify import VerifiedChain
from sidecar.store.credentials import CredentialStore
from sidecar.store.tally import AuditTally
from sidecar.store.trust import TrustStore

__all__ = [
    "APPROVALS",
    "AUDIT",
    "AUDIT_CHAIN",
    "BILLING",
    "CONNECTORS",
    "CONSOLE",
    "CREDENTIAL_STORE",
    "FRONT_DOOR",
    "HUB",
    "INFLIGHT",
    "MCP_ENDPOINT",
    "OAUTH",
    "PATHS",
    "REFUSALS",
    "REGISTRY",
    "RELAY_ENDPOINT",
    "REST",
    "ROUTES",
    "RUNTIME",
    "SESSIONS",
    "SETTINGS",
    "STATE",
    "TOOLS",
    "TRUST",
    "Runtime",
]


@dataclass(slots=True)
class Runtime:
    """Facts known only once the daemon runs: the bound port, the control token, the stop signal."""

    control_token: str
    control_digest: bytes
    port: int = 0
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)

    def request_stop(self) -> None:
        self.stop_event.set()


SETTINGS = web.AppKey("settings", Settings)
PATHS = web.AppKey("paths", Paths)
RUNTIME = web.AppKey("runtime", Runtime)
AUDIT = web.AppKey("audit", AuditLog)
AUDIT_CHAIN = web.AppKey("audit_chain", VerifiedChain)
"""The audit log's last verdict, for the console's audit view (walked again only when the log changed)."""
CREDENTIAL_STORE = web.AppKey("credential_store", CredentialStore)
FRONT_DOOR = web.AppKey("front_door", FrontDoor)
"""Who may connect at all: the peer's account and open connections per uid, decided at accept."""
REFUSALS = web.AppKey("refusals", AuditTally)
"""Requests refused before any credential was known, counted per route and reason: one audit record per
route per minute, never one per request (``request.refused``)."""
STATE = web.AppKey("state", StateJournal)
INFLIGHT = web.AppKey("inflight", InflightTracker)
ROUTES = web.AppKey("routes", RouteRegistry)
SESSIONS = web.AppKey("sessions", SessionStore)
REGISTRY = web.AppKey("registry", ToolRegistry)
TOOLS = web.AppKey("tools", ToolService)
HUB = web.AppKey("hub", ChangeHub)
APPROVALS = web.AppKey("approvals", ApprovalStore)
BILLING = web.AppKey("billing", BillingGate)
CONNECTORS = web.AppKey("connectors", ConnectorService)
TRUST = web.AppKey("trust", TrustStore)
OAUTH = web.AppKey("oauth", Broker)
PROCESS_CREDENTIALS = web.AppKey("process_credentials", ProcessCredentials)
INTERNAL_API = web.AppKey("internal_api", InternalApi)
MCP_ENDPOINT = web.AppKey("mcp_endpoint", McpEndpoint)
RELAY_ENDPOINT = web.AppKey("relay_endpoint", McpEndpoint)
REST = web.AppKey("rest", RestFacade)
CONSOLE = web.AppKey("console", ConsoleSignIn)
