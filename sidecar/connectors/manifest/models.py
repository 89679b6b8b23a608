"""The connector manifests as pydantic models: what each file may hold, declared once.

``connector.json`` (``ConnectorFile``), a package's ``mcp.json`` (``PackageServersFile``), ``oauth-client.json``
(``OAuthClientFile``), the user's ``mcp.json`` and a plugin's ``.mcp.json`` (``ServersFile``) and a plugin's
``plugin.json`` (``PluginFile``). Every model is frozen, strict (``"yes"`` is not ``true``, ``1`` is not ``"1"``)
and refuses unknown keys, since a typo must not be ignored; the keys agent hosts add to an entry
(``disabled``, ``autoApprove``...) and Claude Code's plugin metadata are declared and ignored. The values
themselves are the checked types of ``fields``.

A file's ``mcpServers`` are held raw and each entry is validated on its own (``validate_entry``), so one
broken entry hides no other. An entry is stdio (``StdioEntry``, ``{"command", "args", "env", "cwd"}``) or
Streamable HTTP (``HttpEntry``, ``{"type": "http", "url", "headers", "oauth"}``); ``entry_model`` picks by ``type``.
Validate with a ``fields.Context`` as pydantic's context: some rules depend on where a file sits.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sidecar.bus.billing import BillableTool
from sidecar.connectors.manifest.fields import (
    GIVEN,
    ClientSecretFile,
    Command,
    Context,
    Cwd,
    DeferLoading,
    EnvName,
    Headers,
    HttpOnly,
    InlineClientSecret,
    LaunchText,
    LaunchUrl,
    MetadataDocumentUrl,
    OneServer,
    PackageId,
    PluginName,
    Prose,
    Risk,
    SandboxPath,
    ScopeToken,
    ServerName,
    StdioOnly,
    Text,
    ToolName,
    UnknownTransport,
    context_of,
)
from sidecar.connectors.manifest.spec import ProcessMode, session_dependence

__all__ = [
    "ConnectorFile",
    "HttpEntry",
    "HttpOAuth",
    "PackageServersFile",
    "PluginFile",
    "SandboxFile",
    "ServersFile",
    "StdioEntry",
    "ToolEntry",
    "entry_model",
    "is_disabled",
    "shared_refusal",
    "validate_entry",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, use_attribute_docstrings=True)


# ---------------------------------------------------------------------------------------------- entries


class ToolEntry(_Model):
    """How risky one of a connector's tools is (unlisted tools get the default tier), and, in a user's or
    plugin's ``mcp.json`` entry, whether a call costs money (``billable``: every call asks, in every mode)."""

    risk: Risk
    billable: BillableTool | None = None
    """``{"approvalKind", "group"}`` as in ``high-credit-tools.json``, where a package lists them instead."""


class SandboxFile(_Model):
    """What a connector's sandbox shows it beyond the system and its own files (contract §5): nothing
    unless declared here. Part of the trust key."""

    workspace: Literal["none", "read", "read-write"] = "none"
    """The session's workspace: not shown (the default), read-only, or read-write."""
    read_paths: list[SandboxPath] = Field(default_factory=list, alias="readPaths")
    """More absolute paths shown read-only (never sidecar's own directories nor your whole home)."""
    write_paths: list[SandboxPath] = Field(default_factory=list, alias="writePaths")
    """More absolute paths shown read-write."""
    required: bool = False
    """``true``: where there is no sandbox (no bubblewrap, no user namespaces, not Linux) it does not start."""

    @model_validator(mode="before")
    @classmethod
    def _required_shorthand(cls, value: object) -> object:
        """``"required"`` is short for ``{"required": true}``: the defaults, and no start unsandboxed."""
        return {"required": True} if value == "required" else value


_NO_WORKSPACE_WHEN_SHARED: Final = (
    "a shared process serves every session, so its sandbox cannot show one session's workspace"
)


class _Entry(_Model):
    """Keys agent hosts add to an entry (accepted and ignored, but for ``disabled``), and sidecar's own."""

    disabled: bool = False
    """``true`` skips the entry; a package's one server cannot be disabled."""
    auto_approve: Any = Field(default=None, alias="autoApprove")
    always_allow: Any = Field(default=None, alias="alwaysAllow")
    timeout: Any = None
    description: Any = None
    defer_loading: DeferLoading | None = None
    """Which of the server's tools stay out of ``tools/list`` (found with ``tool_search``): ``true`` all,
    ``false`` none, or a list of its own tool names; unset, ``[tools] defer_connectors`` decides."""
    sidecar_network: bool | None = Field(default=None, alias="sidecarNetwork")
    """``false``: the server works offline, so sessions without the network may use it (default: it needs
    the network). A package declares this in ``connector.json`` (``network``) instead."""
    process: ProcessMode | None = None
    """``"shared"``: one process serves every session (a stdio entry with nothing per session in it);
    unset or ``"session"``: a process per session. A package declares this in ``connector.json``."""
    tools: dict[ToolName, ToolEntry] | None = None
    """Tool name → risk tier, as a package's ``connector.json`` has it (unlisted tools are MEDIUM); part of
    the trust key. A package declares this in ``connector.json``."""
    sidecar_sandbox: SandboxFile | Literal[False] | None = Field(default=None, alias="sidecarSandbox")
    """What the server's sandbox shows it (``{"workspace", "readPaths", "writePaths", "required"}``, or
    ``"required"`` alone), or,
    in your own ``mcp.json`` only, ``false``: it runs unsandboxed, shown so everywhere. A package declares
    this in ``connector.json`` (``sandbox``)."""

    @field_validator("disabled")
    @classmethod
    def _package_runs(cls, value: bool, info: ValidationInfo) -> bool:
        if value and context_of(info).kind == "package":
            raise ValueError("a package's server cannot be disabled; untrust or remove the package")
        return value

    @field_validator("sidecar_network")
    @classmethod
    def _package_declares_network_in_its_connector_file(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        if value is not None and context_of(info).kind == "package":
            raise ValueError('a package declares this in connector.json ("network": false)')
        return value

    @field_validator("tools")
    @classmethod
    def _package_declares_tools_in_its_connector_file(
        cls, value: dict[str, ToolEntry] | None, info: ValidationInfo
    ) -> dict[str, ToolEntry] | None:
        if value is not None and context_of(info).kind == "package":
            raise ValueError('a package declares its tools\' risk in connector.json ("tools")')
        return value

    @field_validator("sidecar_sandbox")
    @classmethod
    def _sandbox_declared_where_it_may_be(
        cls, value: SandboxFile | Literal[False] | None, info: ValidationInfo
    ) -> SandboxFile | Literal[False] | None:
        kind = context_of(info).kind
        if value is not None and kind == "package":
            raise ValueError('a package declares this in connector.json ("sandbox")')
        if value is False and kind != "user":
            raise ValueError("only your own mcp.json may run a server unsandboxed")
        return value

    @field_validator("process")
    @classmethod
    def _package_declares_process_in_its_connector_file(
        cls, value: ProcessMode | None, info: ValidationInfo
    ) -> ProcessMode | None:
        if value is not None and context_of(info).kind == "package":
            raise ValueError('a package declares this in connector.json ("process": "shared")')
        return value


class HttpOAuth(_Model):
    """An HTTP entry's ``oauth``: how sidecar is known to the server's authorization server. Either a
    client registered there beforehand (``clientId``, for one without dynamic registration), or a Client
    ID Metadata Document sidecar is identified by (``clientMetadataUrl``; used where the AS supports
    them, dynamic registration elsewhere); instead of registering sidecar there."""

    client_id: Text | None = Field(default=None, alias="clientId")
    client_metadata_url: MetadataDocumentUrl | None = Field(default=None, alias="clientMetadataUrl")
    client_secret_file: Annotated[ClientSecretFile | None, GIVEN] = Field(default=None, alias="clientSecretFile")
    """Absolute path of a file (0600, the user's own) holding the client secret; read at each sign-in."""
    client_secret: InlineClientSecret = Field(default=None, alias="clientSecret", exclude=True)
    """Refused whenever present; its value is never read nor repeated."""
    scopes: list[ScopeToken] = Field(default_factory=list)
    """The scopes to ask for beside what the server's challenge or metadata names."""

    @field_validator("client_id", "client_metadata_url")
    @classmethod
    def _packages_declare_clients_elsewhere(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and context_of(info).kind == "package":
            raise ValueError("a package declares its OAuth client in oauth-client.json")
        return value

    @model_validator(mode="after")
    def _one_identity(self) -> HttpOAuth:
        if (self.client_id is None) == (self.client_metadata_url is None):
            raise ValueError("give exactly one of clientId (a registered client) and clientMetadataUrl")
        if self.client_metadata_url is not None and self.client_secret_file is not None:
            raise ValueError("clientSecretFile goes with clientId; a metadata document client has no secret")
        return self


class StdioEntry(_Entry):
    """A server sidecar starts: argv is ``command`` + ``args``; ``env`` is added to a scrubbed environment."""

    type: Literal["stdio"] | None = None
    command: Command
    args: list[LaunchText] = Field(default_factory=list)
    env: dict[EnvName, LaunchText] = Field(default_factory=dict)
    cwd: Annotated[Cwd | None, GIVEN] = None
    url: HttpOnly = None
    headers: HttpOnly = None
    oauth: HttpOnly = None

    @model_validator(mode="after")
    def _shared_only_when_session_free(self) -> StdioEntry:
        if self.process == "shared":
            refusal = shared_refusal(self.command, self.args, self.env, self.cwd)
            if refusal is not None:
                raise ValueError(refusal)
            if self.sidecar_sandbox and self.sidecar_sandbox.workspace != "none":
                raise ValueError(_NO_WORKSPACE_WHEN_SHARED)
        return self


def shared_refusal(command: str | None, args: list[str], env: dict[str, str], cwd: str | None) -> str | None:
    """Why a stdio config may not say ``"process": "shared"``, or ``None`` when it may."""
    reason = session_dependence(command, args, env, cwd)
    if reason is None:
        return None
    return f'"process": "shared" needs a launch config that is the same in every session, but {reason}'


class HttpEntry(_Entry):
    """A Streamable HTTP server sidecar reaches at ``url``, sending ``headers``."""

    type: Literal["http", "streamable-http"] | None = None
    url: LaunchUrl
    headers: Headers = Field(default_factory=dict)
    oauth: HttpOAuth | None = None
    """How sidecar is known to the AS (``{"clientId", "clientSecretFile", "scopes"}`` or
    ``{"clientMetadataUrl", "scopes"}``); part of the trust key."""
    command: StdioOnly = None
    args: StdioOnly = None
    env: StdioOnly = None
    cwd: StdioOnly = None

    @field_validator("process")
    @classmethod
    def _no_process_to_share(cls, value: ProcessMode | None) -> ProcessMode | None:
        if value == "shared":
            raise ValueError("a remote (http) server has no process of sidecar's to share")
        return value

    @field_validator("sidecar_sandbox")
    @classmethod
    def _no_process_to_sandbox(cls, value: object) -> None:
        if value is not None:
            raise ValueError("a remote (http) server has no process of sidecar's to sandbox")


class _OtherTransport(_Entry, extra="allow"):
    """An entry whose ``type`` names a transport sidecar does not run; it never validates."""

    type: UnknownTransport


_TRANSPORTS: Final[dict[object, type[_Entry]]] = {
    "stdio": StdioEntry,
    "http": HttpEntry,
    "streamable-http": HttpEntry,
}


def entry_model(raw: object) -> type[_Entry]:
    """The model for an ``mcpServers`` entry: by its ``type``, else HTTP when it has a ``url`` but no ``command``."""
    if not isinstance(raw, dict):
        return StdioEntry  # which refuses it as not an object
    declared = raw.get("type")
    if declared is None:
        return HttpEntry if "url" in raw and "command" not in raw else StdioEntry
    return _TRANSPORTS.get(declared, _OtherTransport) if isinstance(declared, str) else _OtherTransport


_ENTRIES: Final[dict[type[_Entry], TypeAdapter[Any]]] = {
    StdioEntry: TypeAdapter(dict[ServerName, StdioEntry]),
    HttpEntry: TypeAdapter(dict[ServerName, HttpEntry]),
    _OtherTransport: TypeAdapter(dict[ServerName, _OtherTransport]),
}


def validate_entry(name: str, raw: object, context: Context) -> StdioEntry | HttpEntry:
    """One ``mcpServers`` entry with its name; a ``ValidationError`` is located from the name (``[name, ...]``)."""
    entry = _ENTRIES[entry_model(raw)].validate_python({name: raw}, context=context)[name]
    if not isinstance(entry, StdioEntry | HttpEntry):  # _OtherTransport never validates; no assert under -OO
        raise TypeError(f"{name}: not a stdio or http entry")
    return entry


class _Switch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)
    disabled: bool = False


def is_disabled(raw: object) -> bool:
    """``"disabled": true``: the entry is skipped unread, even when broken. A bad ``disabled`` is not true."""
    if not isinstance(raw, dict):
        return False
    try:
        return _Switch.model_validate(raw).disabled
    except ValidationError:
        return False


# ---------------------------------------------------------------------------------------------- files


class ServersFile(_Model):
    """The user's ``<config>/mcp.json`` or a plugin's ``.mcp.json``: ``{"mcpServers": {name: entry}}``."""

    schema_: Any = Field(default=None, alias="$schema")
    mcp_servers: dict[str, Any] = Field(default_factory=dict, alias="mcpServers")
    """Each entry is validated on its own (``validate_entry``)."""
    defer_loading: DeferLoading | None = None
    """The ``defer_loading`` of every entry in the file that does not say its own."""


class PackageServersFile(ServersFile):
    """A package's ``mcp.json``: the same shape, with exactly one server."""

    mcp_servers: OneServer = Field(default_factory=dict, alias="mcpServers", validate_default=True)


class ConnectorFile(_Model):
    """A package's ``connector.json``: who it is and how risky its tools are."""

    schema_: Any = Field(default=None, alias="$schema")
    id: PackageId
    """The server name in ``mcp__<id>__<tool>``; the package directory's name."""
    name: Text
    type: Literal["mcp"]
    description: Prose = ""
    examples: list[Prose] = Field(default_factory=list)
    version: Text | None = None
    source: Text | None = None
    tools: dict[ToolName, ToolEntry] = Field(default_factory=dict)
    """Tool name → risk tier; ``mcp__<id>__<tool>`` must fit in 64 characters."""
    network: bool = True
    """``false``: the connector works offline, so sessions without the network may use it."""
    process: ProcessMode = "session"
    """``"shared"``: one process of it serves every session (its ``mcp.json`` must have nothing per session)."""
    sandbox: SandboxFile = Field(default_factory=SandboxFile)
    """What its sandbox shows it beyond the system and the package's own files; a package cannot opt out."""

    @model_validator(mode="after")
    def _shared_sees_no_workspace(self) -> ConnectorFile:
        if self.process == "shared" and self.sandbox.workspace != "none":
            raise ValueError(_NO_WORKSPACE_WHEN_SHARED)
        return self

    @field_validator("tools")
    @classmethod
    def _package_lists_billable_tools_in_its_manifest(cls, value: dict[str, ToolEntry]) -> dict[str, ToolEntry]:
        if any(entry.billable is not None for entry in value.values()):
            raise ValueError("a package lists its billable tools in high-credit-tools.json, not connector.json")
        return value


class PluginFile(_Model):
    """A plugin's ``plugin.json``; Claude Code's metadata keys are accepted (one directory serves both)."""

    name: Annotated[PluginName | None, GIVEN] = None
    """Checked first: a plugin.json that claims another plugin refuses the whole plugin."""
    schema_: Any = Field(default=None, alias="$schema")
    version: Prose = ""
    description: Prose = ""
    mcp_servers: dict[str, Any] = Field(default_factory=dict, alias="mcpServers")
    """Each entry is validated on its own (``validate_entry``), like a ``.mcp.json``'s."""
    defer_loading: DeferLoading | None = None
    """The ``defer_loading`` of every entry here that does not say its own."""
    author: Any = None
    homepage: Any = None
    repository: Any = None
    license: Any = None
    keywords: Any = None
    commands: Any = None
    agents: Any = None
    hooks: Any = None
    skills: Any = None
