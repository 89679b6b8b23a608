"""What a connector is once its manifest is validated: a ``ConnectorSpec``, or a ``ManifestProblem``.

Plain frozen values, whatever the source (a package, the user's ``mcp.json``, a plugin); ``sources``
builds them and the rest of ``sidecar.connectors`` (trust keys, the pool, the proxy) reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

from sidecar.bus.billing import BillableTool
from sidecar.oauth.declared import OAuthClient, Provider

__all__ = [
    "SESSION_PLACEHOLDERS",
    "Confinement",
    "ConnectorSpec",
    "LaunchConfig",
    "ManifestProblem",
    "ProcessMode",
    "session_dependence",
]

ProcessMode = Literal["session", "shared"]
"""``session``: a process per session (the default); ``shared``: one process serves every session."""

SESSION_PLACEHOLDERS: Final = ("SIDECAR_PROJECT_DIR", "SIDECAR_MCP_CONTEXT", "SIDECAR_LOCAL_MCP_AUTHORIZATION")
"""The placeholders that expand differently in each session: its workspace, its envelope, its credential."""


def session_dependence(command: str | None, args: Iterable[str], env: Mapping[str, str], cwd: str | None) -> str | None:
    """Why a stdio launch config makes a different process in each session, or ``None`` when one process
    could serve any session (a warm spare, a shared process): no per-session placeholder in its command,
    arguments, environment values or working directory, and a working directory of its own (without one,
    a connector runs in the session's workspace)."""
    if cwd is None:
        return "it has no cwd, so it runs in each session's workspace"
    texts = [("command", command or ""), *(("args", a) for a in args), *((f"env {k}", v) for k, v in env.items())]
    for where, text in [*texts, ("cwd", cwd)]:
        for name in SESSION_PLACEHOLDERS:
            if "${" + name + "}" in text:
                return f"its {where} uses ${{{name}}}"
    return None


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How to start (stdio) or reach (Streamable HTTP) one MCP server; placeholders still unexpanded."""

    transport: Literal["stdio", "http"]
    command: str | None
    """stdio: argv[0]. Never parsed by a shell: argv is ``command`` + ``args``."""
    args: tuple[str, ...]
    env: Mapping[str, str]
    """stdio: what the entry declares, added to the scrubbed environment at spawn."""
    cwd: str | None
    url: str | None
    """http: ``https://`` anywhere, ``http://`` only to a loopback host."""
    headers: Mapping[str, str]
    oauth: OAuthClient | None = None
    """http: the client to sign in as, instead of registering one dynamically."""


WorkspaceAccess = Literal["none", "read", "read-write"]


@dataclass(frozen=True, slots=True)
class Confinement:
    """What a stdio connector's sandbox shows it beyond the system and its own files, as it declares
    (``connector.json`` ``sandbox``, an entry's ``sidecarSandbox``); ``sidecar.connectors.stdio.sandbox``
    turns it into a ``bwrap`` command line. The default: no workspace, no extra path, sandboxed where
    there is a sandbox."""

    enabled: bool = True
    """``False``: the user's own ``mcp.json`` entry opted out (``"sidecarSandbox": false``)."""
    workspace: WorkspaceAccess = "none"
    """The session's workspace: not shown, read-only, or read-write."""
    read_paths: tuple[str, ...] = ()
    write_paths: tuple[str, ...] = ()
    required: bool = False
    """``True``: where there is no sandbox, the connector does not start."""

    def declared(self) -> dict[str, object] | None:
        """The declaration as the trust key and ``connectors show`` hold it; ``None`` for the default."""
        if self == _DEFAULT_CONFINEMENT:
            return None
        if not self.enabled:
            return {"enabled": False}
        return {
            "workspace": self.workspace,
            "read_paths": list(self.read_paths),
            "write_paths": list(self.write_paths),
            "required": self.required,
        }


_DEFAULT_CONFINEMENT: Final = Confinement()


@dataclass(frozen=True, slots=True)
class ConnectorSpec:
    """One connector from any source, validated; trust is keyed on it (``trustkey.trust_key``)."""

    id: str
    """The server name in ``mcp__<id>__<tool>``: lowercase, at most ``fields.MAX_ID_LENGTH`` characters."""
    kind: Literal["package", "user", "plugin"]
    name: str
    description: str
    version: str | None
    examples: tuple[str, ...]
    launch: LaunchConfig
    root: Path | None
    """The package or plugin directory (``${SIDECAR_CONNECTOR_ROOT}``); ``None`` for user servers."""
    origin: Path
    """The file it came from."""
    tool_risks: Mapping[str, str]
    """Tool name → ``LOW`` | ``MEDIUM`` | ``HIGH`` from ``connector.json``; unlisted tools default elsewhere."""
    oauth: Provider | None
    """A package's validated ``oauth-client.json`` (``None`` when the file is absent)."""
    billing_manifest: Path | None
    """``<root>/high-credit-tools.json`` when it exists (the billing gate validates it, failing closed)."""
    tool_billing: Mapping[str, BillableTool] = field(default_factory=lambda: MappingProxyType({}))
    """Tool name → what a call costs, as a user's or plugin's ``mcp.json`` entry declares it (``billable``)."""
    network: bool = True
    """Whether its tools need the session's network permission: true unless the connector declares it
    works offline (``connector.json`` ``"network": false``, an entry's ``"sidecarNetwork": false``)."""
    defer_loading: bool | frozenset[str] | None = None
    """Which of its tools it asks to keep out of ``tools/list``: all, none, those named (its own names),
    or ``None``: it does not say (``[tools] defer_connectors`` decides)."""

    process: ProcessMode = "session"
    """``shared`` when its ``connector.json`` or its entry says ``"process": "shared"``: one process of it
    serves every session (only a config ``session_dependence`` finds nothing in may say so)."""
    sandbox: Confinement = _DEFAULT_CONFINEMENT
    """What its sandbox shows it (stdio only)."""

    @property
    def session_free(self) -> bool:
        """One process of it could serve any session: a stdio config with nothing per session in it."""
        launch = self.launch
        if launch.transport != "stdio" or self.sandbox.workspace != "none":
            return False  # a sandbox that shows a workspace shows one session's
        return session_dependence(launch.command, launch.args, launch.env, launch.cwd) is None

    def deferred(self, tool: str, *, default: bool) -> bool:
        """Whether the connector asks for its tool ``tool`` to be deferred; ``default`` when it does not say."""
        if self.defer_loading is None:
            return default
        if isinstance(self.defer_loading, bool):
            return self.defer_loading
        return tool in self.defer_loading


@dataclass(frozen=True, slots=True)
class ManifestProblem:
    """A file, entry or package that was refused; ``message`` has a line per fault, each naming file and field."""

    path: Path
    message: str

    def __str__(self) -> str:
        return self.message
