"""What a connector is started with (stdio) or reached by (Streamable HTTP): placeholders expanded.

A stdio process gets argv (never through a shell), a working directory, and an environment scrubbed
down to ``ENV_ALLOWLIST`` plus what its config declares: no daemon secret, no route token, no user
token. ``${SIDECAR_LOCAL_MCP_AUTHORIZATION}`` carries the process's own internal-API credential when the
context can mint one (contract §5, §7). A remote server gets its URL and headers, and the OAuth
broker's ``httpx2.Auth`` (``HttpAuthSource``) when it signs in.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import httpx2
from mcp.client.streamable_http import streamable_http_client

from sidecar.connectors.manifest.spec import ConnectorSpec
from sidecar.connectors.stdio.sandbox import Sandbox
from sidecar.errors import ToolError

__all__ = [
    "CALL_TIMEOUT",
    "ENV_ALLOWLIST",
    "START_TIMEOUT",
    "HttpAuthSource",
    "LaunchContext",
    "LaunchPlan",
    "http_transport",
    "launch_plan",
    "scrubbed_environment",
]

CALL_TIMEOUT: Final = 300.0
"""Seconds one proxied call may take before it is cancelled at the connector."""
START_TIMEOUT: Final = 30.0
"""Seconds a connector has to spawn and answer ``initialize`` (a cold ``npx``/``uvx`` may download first)."""

ENV_ALLOWLIST: Final = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
)
"""What a connector inherits from the daemon's environment; everything else must be declared."""
_PYTHON_COMMANDS: Final = frozenset({"python", "python3"})


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """What a process's placeholders expand to (contract §5)."""

    origin: str
    authorization: str
    envelope: str
    workspace: str
    mint: Callable[[str], tuple[str, Callable[[], None]]] | None = None
    """A process's own internal-API credential for a connector id: (token, release); when given, it is
    what ``${SIDECAR_LOCAL_MCP_AUTHORIZATION}`` carries, and the process's exit releases it."""
    sandbox: Sandbox | None = None
    """The sandbox a stdio process runs in (``stdio.sandbox``); ``None``: none (unit tests)."""


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """stdio: ``argv``/``env``/``cwd``; Streamable HTTP: ``url``/``headers`` (no process of ours)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    release: Callable[[], None] | None = None
    """Revokes what was minted for this process (its internal-API credential) once it has exited."""


def scrubbed_environment(declared: Mapping[str, str], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowlist from the daemon's environment, then what the connector declares."""
    source = os.environ if source is None else source
    env = {key: source[key] for key in ENV_ALLOWLIST if key in source}
    env.update(declared)
    return env


def launch_plan(spec: ConnectorSpec, context: LaunchContext, *, environ: Mapping[str, str] | None = None) -> LaunchPlan:
    """argv, environment and cwd with every placeholder expanded; argv never goes through a shell."""
    values = {
        "SIDECAR_LOCAL_MCP_ORIGIN": context.origin,
        "SIDECAR_LOCAL_MCP_AUTHORIZATION": context.authorization,
        "SIDECAR_MCP_CONTEXT": context.envelope,
        "SIDECAR_CONNECTOR_ROOT": str(spec.root) if spec.root is not None else "",
        "SIDECAR_PROJECT_DIR": context.workspace,
    }

    def expand(text: str) -> str:
        for name, value in values.items():
            text = text.replace("${" + name + "}", value)
        return text

    launch = spec.launch
    if launch.transport == "http":
        if launch.url is None:
            raise ToolError(f"connector {spec.id} has no URL")
        headers = {k: expand(v) for k, v in launch.headers.items()}
        return LaunchPlan(argv=(), env={}, cwd=None, url=expand(launch.url), headers=headers)
    if launch.command is None:
        raise ToolError(f"connector {spec.id} has no command to run")
    release = None
    if context.mint is not None:  # SECURITY: the process's own credential, never a route or user token
        token, release = context.mint(spec.id)
        values["SIDECAR_LOCAL_MCP_AUTHORIZATION"] = f"Bearer {token}"
    command = expand(launch.command)
    if spec.kind in ("package", "plugin") and command in _PYTHON_COMMANDS:
        # Shipped Python packages run on the daemon's interpreter, where the mcp package is installed.
        command = sys.executable
    env = scrubbed_environment({k: expand(v) for k, v in launch.env.items()}, environ)
    cwd: str | None = expand(launch.cwd) if launch.cwd else context.workspace
    argv: tuple[str, ...] = (command, *(expand(a) for a in launch.args))
    if context.sandbox is not None:
        try:
            argv, env, cwd = context.sandbox.confine(
                spec.id,
                spec.sandbox,
                argv,
                env,
                cwd=cwd,
                workspace=context.workspace,
                roots=[spec.root] if spec.root is not None and spec.kind != "user" else [],
                network=spec.network,
            )
        except BaseException:
            if release is not None:
                release()
            raise
    return LaunchPlan(argv=argv, env=env, cwd=cwd, release=release)


class HttpAuthSource(Protocol):
    """Credentials for remote connectors (the OAuth broker): an ``httpx2.Auth`` per connector, and a
    fast refusal for one that needs a sign-in it lacks (a ``ToolError`` naming the remedy)."""

    def auth_for(self, connector_id: str) -> httpx2.Auth | None: ...

    def require(self, connector_id: str) -> None: ...


@contextlib.asynccontextmanager
async def http_transport(plan: LaunchPlan, *, auth: httpx2.Auth | None = None) -> AsyncIterator[Any]:
    """A Streamable HTTP connector's (read, write) streams: its declared headers, sidecar's timeouts,
    and ``auth`` (the OAuth broker's, for a connector that signs in)."""
    if plan.url is None:
        raise ValueError("http_transport needs a plan with a url")
    timeout = httpx2.Timeout(CALL_TIMEOUT, connect=10.0)
    async with (
        httpx2.AsyncClient(headers=dict(plan.headers), timeout=timeout, auth=auth) as http,
        streamable_http_client(plan.url, http_client=http) as streams,
    ):
        yield streams
