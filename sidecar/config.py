"""Settings: frozen pydantic models. Precedence: defaults < ``<config>/sidecar.toml`` < env < flags.

The defaults here are the contract; ``config/sidecar.toml`` in the repository restates them for users
to copy, and a test keeps the two equal.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sidecar.errors import ConfigError
from sidecar.names import BUILTIN_GRANT, CONNECTOR_ID, is_grant_pattern
from sidecar.origins import Origin, parse_origin
from sidecar.validation import Loc, quote, render_errors

__all__ = [
    "DEFAULT_PORT",
    "LOOPBACK_HOST",
    "Limits",
    "McpSettings",
    "Origin",
    "SessionSettings",
    "Settings",
    "check_bind_host",
    "load_settings",
    "parse_origin",
]

LOOPBACK_HOST = "127.0.0.1"
DEFAULT_PORT = 7437
"""The daemon's port unless the user picks another: fixed, so a host configured once finds the daemon after
every restart (issue 14 item 5). Below Linux's ephemeral range (32768-60999), so no outgoing connection
of this machine is ever given it."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Limits(_Frozen):
    """Bounds on what one request may cost the daemon (contract §3)."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest request body in bytes; more gets 413. 4 MiB, the MCP SDK's own limit."""

    max_json_depth: int = Field(default=64, ge=4, le=512)
    """Deepest nesting of arrays/objects in a JSON body; deeper gets 400 before any parser sees it."""

    body_read_timeout: float = Field(default=30.0, gt=0, le=600)
    """Seconds a client may take to send its whole body; slower gets 408."""

    max_header_bytes: int = Field(default=8190, ge=1024, le=65536)
    """Longest request line or header field; aiohttp answers longer ones with 400."""

    max_headers: int = Field(default=128, ge=16, le=1024)
    """Most header fields in one request."""

    head_read_timeout: float = Field(default=10.0, gt=0, le=300)
    """Seconds a client may take to send a request's line and header fields, counted from the connection
    (first request) or from the request's first byte (later ones); slower gets 408 and is cut off."""

    keepalive_timeout: float = Field(default=75.0, gt=0, le=3600)
    """Seconds an idle keep-alive connection stays open between requests."""

    connections_per_uid: int = Field(default=1024, ge=4, le=65536)
    """Most connections one OS account may hold open at once; more are reset at accept, before a byte is
    read, and counted (``sidecar status``). Only the daemon's own user gets past the peer check (where the
    platform can tell; elsewhere every connection counts against this one cap). 1024: far more than agents
    open (a few each), above the hundreds of stalled sockets the head deadline must outlast, and below
    the descriptors the daemon has once it takes its hard open-files limit."""


class McpSettings(_Frozen):
    """The Streamable HTTP endpoint at ``/mcp``."""

    json_response: bool = False
    """Answer 2025-era POSTs with one JSON body instead of an SSE stream (no request-scoped notifications)."""

    session_idle_timeout: float = Field(default=1800.0, gt=0)
    """Seconds an MCP transport session may sit idle (no request, no open GET stream) before it is closed."""

    max_sessions: int = Field(default=1000, ge=1)
    """Most concurrent MCP transport sessions; more get 503."""


class SessionSettings(_Frozen):
    """Sidecar sessions (the signed context an agent host carries)."""

    default_ttl: int = Field(default=12 * 3600, ge=60)
    """Seconds a new session lives unless ``session new`` asks for less."""

    max_ttl: int = Field(default=30 * 24 * 3600, ge=60)
    """Longest lifetime a session may be given (``session new --ttl 30d`` for a desktop host that cannot
    use ``sidecar exec``)."""

    default_allow: tuple[str, ...] = Field(default=(BUILTIN_GRANT,), max_length=256)
    """The grant of a session created without ``--allow``: the built-ins, and no connector tool unless
    you add its ``mcp__<id>__*`` here (or ``*``)."""

    @field_validator("default_allow")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            if not is_grant_pattern(pattern):
                raise ValueError(
                    f"{quote(pattern)} is not a tool pattern: use a tool name, {BUILTIN_GRANT}, mcp__<id>__* or *"
                )
        return value


class ToolSettings(_Frozen):
    """The tool pool: deferred loading and the billable-tools manifest."""

    defer: tuple[str, ...] = ()
    """Tool names kept out of tools/list; agents find them with tool_search and run them with tool_call."""

    defer_sources: tuple[str, ...] = ()
    """Whole sources (``builtin``, ``connector:<id>``) whose tools are deferred."""

    auto_defer_above: int = Field(default=64, ge=1, le=10_000)
    """When a session may use more tools than this, all but tool_search/tool_call/list_connectors are deferred."""

    defer_connectors: bool = True
    """Connector tools are deferred (found with tool_search, run with tool_call) unless their connector
    declares otherwise (``defer_loading`` in its ``mcp.json`` entry); false lists them directly."""

    direct_connectors: tuple[str, ...] = ()
    """Connector ids whose tools are listed directly, whatever ``defer_connectors`` and the connector say."""

    @field_validator("direct_connectors")
    @classmethod
    def _connector_ids(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for connector_id in value:
            if not CONNECTOR_ID.fullmatch(connector_id):
                raise ValueError(f"{quote(connector_id)} is not a connector id")
        return value

    billing_manifest: str | None = None
    """The built-in tools' high-credit-tools.json; unset means the one shipped with sidecar (config/)."""

    max_result_chars: int = Field(default=8000, ge=200, le=10_000_000)
    """Characters of a tool result the agent gets: longer text is cut with a marker saying how much was
    left out, and structured content whose JSON is longer is left out with the same marker."""

    mark_connector_output: bool = True
    """Fence each text block of a connector's result as untrusted content naming the connector
    (``bus/untrusted.py``); its origin is in the result's ``_meta`` either way."""


class ConnectorSettings(_Frozen):
    """Connector processes (contract §7)."""

    start_timeout: float = Field(default=30.0, gt=0, le=600)
    """Seconds a connector has to start and answer initialize (a cold npx/uvx may download first)."""

    max_per_connector: int = Field(default=32, ge=1, le=1024)
    """Most processes of one connector across all sessions."""

    max_total: int = Field(default=128, ge=1, le=4096)
    """Most connector processes in all."""

    max_per_session: int = Field(default=4, ge=1, le=1024)
    """Most processes one sidecar session may hold of one connector (each 2025-era MCP session on a
    connector's own route has one). At the cap, that session's least recently used idle one gives way.
    Kept below ``max_per_connector`` whatever it says (``session_share``), so one client cannot take a
    connector from everyone."""

    idle_seconds: float = Field(default=900.0, ge=5)
    """A connector process unused this long is stopped (the next call starts it again)."""

    spares: int = Field(default=1, ge=0, le=8)
    """Warm spare processes kept per connector whose launch config has nothing per session in it (a
    ``cwd`` of its own and no workspace, envelope or credential placeholder): a new session's first call
    takes one instead of waiting for a cold start. Started in the background after one is taken, counted
    against the caps (never the last free place; a spare gives way to a session's process), stopped when
    idle like any process. 0 turns them off."""

    share_processes: bool = False
    """Every connector whose launch config has nothing per session in it runs as if it said
    ``"process": "shared"``: one process serves all sessions' calls."""

    sandbox: str = Field(default="bwrap", min_length=1, max_length=4096)
    """The bubblewrap program every stdio connector runs in (a name on ``PATH`` or an absolute path). One
    that is missing or cannot make a sandbox here means connectors run unconfined: said at start, in
    ``sidecar status``, the console and ``connectors show``; one declaring ``"required": true`` does not start."""

    watch: bool = True
    """Re-read connector configs and packages when their files change (within about a second). Off, an
    edit takes effect at the next ``connectors list`` or spawn, which always checks trust against disk."""

    @property
    def session_share(self) -> int:
        """``max_per_session``, kept below ``max_per_connector`` (unless that is 1): one session may
        never hold every process of a connector."""
        return min(self.max_per_session, max(1, self.max_per_connector - 1))


class Settings(_Frozen):
    """Everything the daemon reads at start."""

    host: str = LOOPBACK_HOST
    """Bind address. Only 127.0.0.1 is accepted: sidecar never listens beyond this machine."""

    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    """TCP port on 127.0.0.1. Fixed, so configured hosts find the daemon after a restart; when another
    process holds it the daemon refuses to start and names that process. 0 picks a free one (the chosen
    port is written to runtime.json)."""

    allowed_origins: tuple[str, ...] = ()
    """Browser origins (scheme://host[:port]) allowed to call the daemon; none by default."""

    shutdown_timeout: float = Field(default=5.0, gt=0, le=60)
    """Seconds a graceful stop may take before open connections are cut."""

    limits: Limits = Limits()
    mcp: McpSettings = McpSettings()
    sessions: SessionSettings = SessionSettings()
    tools: ToolSettings = ToolSettings()
    connectors: ConnectorSettings = ConnectorSettings()

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        # SECURITY: the daemon's tokens are the only thing between a LAN peer and the user's tools.
        if value != LOOPBACK_HOST:
            raise ValueError(f"sidecar binds {LOOPBACK_HOST} only; refusing to listen on {quote(value)}")
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            parse_origin(origin)
        return value

    def origin_tuples(self) -> frozenset[Origin]:
        return frozenset(parse_origin(o) for o in self.allowed_origins)


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


_ENV_FIELDS = {"SIDECAR_PORT": "port", "SIDECAR_ALLOWED_ORIGINS": "allowed_origins"}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``SIDECAR_PORT`` and ``SIDECAR_ALLOWED_ORIGINS`` (comma separated) are the env-level settings."""
    found: dict[str, Any] = {}
    if "SIDECAR_PORT" in env:
        found["port"] = env["SIDECAR_PORT"]
    if "SIDECAR_ALLOWED_ORIGINS" in env:
        found["allowed_origins"] = tuple(o for o in env["SIDECAR_ALLOWED_ORIGINS"].split(",") if o.strip())
    return found


def load_settings(
    settings_file: Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build ``Settings`` from file, env and flags; raise ``ConfigError`` naming where the bad value came from."""
    data: dict[str, Any] = {}
    if settings_file is not None and settings_file.exists():
        try:
            data = tomllib.loads(settings_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{settings_file}: cannot read settings: {exc}") from exc
    from_env = _from_env(os.environ if env is None else env)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    merged = _deep_merge(_deep_merge(data, from_env), flags)

    def source(loc: Loc) -> str:
        """Where the value at ``loc`` came from: the flag, the env variable or the file that set it last."""
        top = str(loc[0]) if loc else ""
        if top in flags:
            return f"--{top}"
        if top in from_env:
            return next(name for name, field in _ENV_FIELDS.items() if field == top)
        if settings_file is not None and top in data:
            return str(settings_file)
        return "settings"

    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError("invalid settings: " + render_errors(exc, source=source)) from exc


def check_bind_host(host: str) -> None:
    """Refuse any bind address but loopback, with a clear message (used by ``serve --host``)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if host != LOOPBACK_HOST:
        hint = " (a loopback address, but sidecar uses 127.0.0.1 only)" if ip and ip.is_loopback else ""
        raise ConfigError(f"refusing to bind {host!r}{hint}: sidecar listens on {LOOPBACK_HOST} only")
