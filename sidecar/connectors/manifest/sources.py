"""Connector manifests: every source read, validated (``models``) and made one ``ConnectorSpec``.

Sources, in the order that settles id collisions:

1. packages: ``<dir>/<id>/connector.json`` + ``mcp.json`` (exactly one server) [+ ``oauth-client.json``];
2. the user's servers: ``<config>/mcp.json``, ``{"mcpServers": {name: entry}}``;
3. plugins: ``<data>/plugins/<name>/plugin.json`` and/or its ``.mcp.json``; ids are ``<plugin>-<server>``.

An entry has the shape Claude Code and Cursor write: stdio ``{"command", "args", "env", "cwd", "type"?}`` or
Streamable HTTP ``{"type": "http", "url", "headers"}``; ``"disabled": true`` skips it. Three keys are sidecar's
own: ``"sidecarNetwork": false`` (the server works offline; a package says ``"network": false`` in its
``connector.json``), ``"defer_loading"`` (``true``, ``false`` or a list of its tool names; also allowed
at the top of a file, for every entry that does not say its own) and ``"process": "shared"`` (one process
serves every session; refused on a config with anything per session in it, ``spec.session_dependence``;
a package says it in its ``connector.json``).

Every problem names the file and the field, one line each (``sidecar.validation``):
``<path>: <field>: <what>``, or ``<path>: <what>`` for the whole file. A broken entry is one problem and a
broken package is one problem; neither hides anything else, and a wrong top-level key of the user's or a
plugin's file is a problem that still lets its servers load. An id that is already taken is refused, never
renamed: a renamed id would silently move trust and tool names to another server. Files are read through
``store.files`` (no symlink, the user's own, not writable by others) and parsed strictly (no NaN, no
duplicate keys).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from sidecar.connectors.manifest.fields import MAX_ID_LENGTH, PLACEHOLDERS, Context, id_problem
from sidecar.connectors.manifest.models import (
    ConnectorFile,
    HttpEntry,
    PackageServersFile,
    PluginFile,
    SandboxFile,
    ServersFile,
    StdioEntry,
    is_disabled,
    shared_refusal,
    validate_entry,
)
from sidecar.connectors.manifest.oauth_client import OAuthClientFile
from sidecar.connectors.manifest.spec import Confinement, ConnectorSpec, LaunchConfig, ManifestProblem
from sidecar.errors import ConfigError, StorageError
from sidecar.oauth.declared import OAuthClient
from sidecar.store.files import loads_strict, read_private
from sidecar.validation import error_lines, problem_line, quote, render_errors

__all__ = [
    "BILLING_FILE",
    "CONNECTOR_FILE",
    "LAUNCH_FILE",
    "MAX_ID_LENGTH",
    "OAUTH_FILE",
    "PLACEHOLDERS",
    "PLUGIN_FILE",
    "PLUGIN_LAUNCH_FILE",
    "ConnectorSpec",
    "LaunchConfig",
    "ManifestProblem",
    "discover",
    "load_package",
    "load_plugin",
    "load_user_servers",
]

CONNECTOR_FILE: Final = "connector.json"
LAUNCH_FILE: Final = "mcp.json"
OAUTH_FILE: Final = "oauth-client.json"
BILLING_FILE: Final = "high-credit-tools.json"
PLUGIN_FILE: Final = "plugin.json"
PLUGIN_LAUNCH_FILE: Final = ".mcp.json"

_MAX_FILE_BYTES: Final = 1024 * 1024  # a manifest is a few KiB; anything near this is a mistake
_SERVERS: Final = ("mcpServers",)  # where an entry's field path starts


class _Invalid(Exception):
    """Internal: carries the problem (with its path) out of a loader; the public API maps it."""

    def __init__(self, problem: ManifestProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _problem(path: Path, lines: Iterable[str]) -> ManifestProblem:
    return ManifestProblem(path, "\n".join(lines))


# ---------------------------------------------------------------------------------------------- reading

_M = TypeVar("_M", bound=BaseModel)


def _read(path: Path) -> object:
    """Parse one manifest; ``FileNotFoundError`` passes through, anything else wrong raises ``_Invalid``."""
    try:
        raw = read_private(path, max_bytes=_MAX_FILE_BYTES)  # SECURITY: no symlink, ours, not writable by others
    except StorageError as exc:
        if path.is_symlink():
            what = "is a symbolic link; manifests are read only from regular files (copy the file instead)"
        else:
            what = str(exc).removeprefix(str(path)).lstrip(": ")
        raise _Invalid(ManifestProblem(path, f"{path}: {what}")) from exc
    try:
        return loads_strict(raw)
    except (ValueError, RecursionError) as exc:
        raise _Invalid(ManifestProblem(path, f"{path}: not valid JSON ({exc})")) from exc


def _read_required(path: Path, role: str) -> object:
    try:
        return _read(path)
    except FileNotFoundError:
        raise _Invalid(ManifestProblem(path, f"{path}: missing; {role}")) from None


def _validate(model: type[_M], path: Path, data: object, context: Context) -> _M:
    """The whole file as ``model``, or ``_Invalid`` with every problem in it."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise _Invalid(ManifestProblem(path, render_errors(exc, source=str(path)))) from exc


def _validate_salvaging(
    model: type[_M], path: Path, data: object, context: Context
) -> tuple[_M | None, ManifestProblem | None, frozenset[int | str]]:
    """The file as ``model``, its problem, and the top-level keys that have one.

    Those keys are dropped and the rest validated again, so what is sound in the file still counts; the
    model is ``None`` when nothing can be kept (not an object, or a required key is wrong).
    """
    try:
        return model.model_validate(data, context=context), None, frozenset()
    except ValidationError as exc:
        problem = ManifestProblem(path, render_errors(exc, source=str(path)))
        locs = [error["loc"] for error in exc.errors()]
        wrong = frozenset(loc[0] for loc in locs if loc)
        if not isinstance(data, dict) or not all(locs):
            return None, problem, wrong
        try:
            kept = model.model_validate({k: v for k, v in data.items() if k not in wrong}, context=context)
        except ValidationError:
            kept = None
        return kept, problem, wrong


def _deferral(declared: bool | list[str] | None) -> bool | frozenset[str] | None:
    return frozenset(declared) if isinstance(declared, list) else declared


def _confinement(declared: SandboxFile | bool | None) -> Confinement:
    if declared is False:
        return Confinement(enabled=False)
    if not isinstance(declared, SandboxFile):
        return Confinement()
    return Confinement(
        workspace=declared.workspace,
        read_paths=tuple(declared.read_paths),
        write_paths=tuple(declared.write_paths),
        required=declared.required,
    )


def _entry_facts(entry: StdioEntry | HttpEntry, file_default: bool | list[str] | None) -> dict[str, Any]:
    """What an entry declares for sidecar itself: network, deferral (the entry's own, else its file's),
    process sharing and its sandbox."""
    declared = entry.defer_loading if entry.defer_loading is not None else file_default
    return {
        "network": entry.sidecar_network is not False,
        "defer_loading": _deferral(declared),
        "process": entry.process or "session",
        "sandbox": _confinement(entry.sidecar_sandbox),
    }


def _launch(entry: StdioEntry | HttpEntry) -> LaunchConfig:
    if isinstance(entry, HttpEntry):
        headers = MappingProxyType(dict(entry.headers))
        oauth = None
        if entry.oauth is not None:
            given, secret = entry.oauth, entry.oauth.client_secret_file
            document = given.client_metadata_url is not None
            client_id = given.client_metadata_url if given.client_metadata_url is not None else given.client_id
            if client_id is None:  # the model refuses an entry with neither
                raise ValueError("an oauth block without a client")
            oauth = OAuthClient(client_id, Path(secret) if secret else None, tuple(given.scopes), document)
        return LaunchConfig("http", None, (), MappingProxyType({}), None, entry.url, headers, oauth)
    env = MappingProxyType(dict(entry.env))
    return LaunchConfig("stdio", entry.command, tuple(entry.args), env, entry.cwd, None, MappingProxyType({}))


def _entry(path: Path, name: str, raw: object, context: Context, lines: list[str]) -> StdioEntry | HttpEntry | None:
    """Validate one ``mcpServers`` entry (and its name); on failure add its problem lines and return ``None``."""
    try:
        return validate_entry(name, raw, context)
    except ValidationError as exc:
        lines.extend(error_lines(exc, source=str(path), prefix=_SERVERS))
        return None


# ---------------------------------------------------------------------------------------------- packages


def _billing(root: Path) -> Path | None:
    path = root / BILLING_FILE
    return path if os.path.lexists(path) else None


def _package(directory: Path) -> ConnectorSpec:
    context = Context("package", directory.name)
    origin = directory / CONNECTOR_FILE
    data = _read_required(origin, "a connector package needs connector.json")
    connector = _validate(ConnectorFile, origin, data, context)
    launch_path = directory / LAUNCH_FILE
    data = _read_required(launch_path, "a connector package needs mcp.json with its one server")
    servers = _validate(PackageServersFile, launch_path, data, context)
    ((server, raw),) = servers.mcp_servers.items()
    lines: list[str] = []
    entry = _entry(launch_path, server, raw, context, lines)
    if entry is None:
        raise _Invalid(_problem(launch_path, lines))
    if connector.process == "shared":
        launch = _launch(entry)
        refusal = shared_refusal(launch.command, list(launch.args), dict(launch.env), launch.cwd)
        if refusal is not None:  # connector.json asks for what its mcp.json cannot give
            raise _Invalid(_problem(origin, [f"{origin}: process: {refusal} ({launch_path})"]))
    oauth = None
    oauth_path = directory / OAUTH_FILE
    if os.path.lexists(oauth_path):
        data = _read_required(oauth_path, "it vanished while being read")
        oauth = _validate(OAuthClientFile, oauth_path, data, context).declared()
    return ConnectorSpec(
        id=connector.id,
        kind="package",
        name=connector.name,
        description=connector.description,
        version=connector.version,
        examples=tuple(connector.examples),
        launch=_launch(entry),
        root=directory,
        origin=origin,
        tool_risks=MappingProxyType({tool: tier.risk for tool, tier in connector.tools.items()}),
        oauth=oauth,
        billing_manifest=_billing(directory),
        network=connector.network,
        process=connector.process,
        sandbox=_confinement(connector.sandbox),
        defer_loading=_deferral(entry.defer_loading if entry.defer_loading is not None else servers.defer_loading),
    )


def load_package(directory: Path) -> ConnectorSpec:
    """Load the package in ``directory``; ``ConfigError`` names the file and field of the first bad file."""
    try:
        return _package(directory)
    except _Invalid as exc:
        raise ConfigError(exc.problem.message) from exc


# ---------------------------------------------------------------------------------------------- user, plugins


def _server_spec(
    spec_id: str,
    kind: Literal["user", "plugin"],
    name: str,
    entry: StdioEntry | HttpEntry,
    origin: Path,
    *,
    file_default: bool | list[str] | None,
    **extra: Any,
) -> ConnectorSpec:
    """A spec for a server without a package: the tool risks and billable tools its entry declares, no
    OAuth client."""
    fields: dict[str, Any] = {"description": "", "version": None, "root": None, "billing_manifest": None}
    fields.update(extra)
    tools = entry.tools or {}
    return ConnectorSpec(
        id=spec_id,
        kind=kind,
        name=name,
        examples=(),
        launch=_launch(entry),
        origin=origin,
        tool_risks=MappingProxyType({tool: tier.risk for tool, tier in tools.items()}),
        tool_billing=MappingProxyType({tool: tier.billable for tool, tier in tools.items() if tier.billable}),
        oauth=None,
        **fields,
        **_entry_facts(entry, file_default),
    )


def load_user_servers(path: Path) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """The user's ``mcp.json``: each entry validated on its own. A missing file means no servers."""
    try:
        data = _read(path)
    except FileNotFoundError:
        return [], []
    except _Invalid as exc:
        return [], [exc.problem]
    context = Context("user")
    servers, top, _ = _validate_salvaging(ServersFile, path, data, context)
    specs: list[ConnectorSpec] = []
    problems = [top] if top is not None else []
    if servers is None:
        return specs, problems
    for name, raw in servers.mcp_servers.items():
        if is_disabled(raw):
            continue
        lines: list[str] = []
        if (entry := _entry(path, name, raw, context, lines)) is not None:
            specs.append(_server_spec(name, "user", name, entry, path, file_default=servers.defer_loading))
        else:
            problems.append(_problem(path, lines))
    return specs, problems


_PluginSource = tuple[Path, Mapping[str, Any], bool | list[str] | None]
"""A plugin file: where it is, its servers, and its file-wide ``defer_loading``."""


def _plugin_sources(
    directory: Path, context: Context, problems: list[ManifestProblem]
) -> tuple[list[_PluginSource], PluginFile | None]:
    """Each file's servers, ``plugin.json`` first, and ``plugin.json`` itself when there is one.

    ``_Invalid`` when ``plugin.json`` refuses the whole plugin: unreadable, not an object, or naming another
    plugin. Any other problem of either file goes to ``problems``; what is sound in the file still counts.
    """
    sources: list[_PluginSource] = []
    manifest: PluginFile | None = None
    manifest_path = directory / PLUGIN_FILE
    try:
        data = _read(manifest_path)
    except FileNotFoundError:
        pass
    else:
        manifest, problem, wrong = _validate_salvaging(PluginFile, manifest_path, data, context)
        if problem is not None:
            # SECURITY: a plugin.json that names another plugin would borrow its name and id prefix.
            if manifest is None or "name" in wrong:
                raise _Invalid(problem)
            problems.append(problem)
        if manifest is None:  # refused above with its problem; no assert: the daemon runs with -OO
            raise _Invalid(ManifestProblem(manifest_path, f"{manifest_path}: not a plugin manifest"))
        sources.append((manifest_path, manifest.mcp_servers, manifest.defer_loading))
    launch_path = directory / PLUGIN_LAUNCH_FILE
    try:
        data = _read(launch_path)
    except FileNotFoundError:
        pass
    except _Invalid as exc:
        problems.append(exc.problem)
    else:
        servers, problem, _ = _validate_salvaging(ServersFile, launch_path, data, context)
        problems.extend([problem] if problem is not None else [])
        if servers is not None:
            sources.append((launch_path, servers.mcp_servers, servers.defer_loading))
    return sources, manifest


def load_plugin(directory: Path) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """A plugin's servers from ``plugin.json`` then ``.mcp.json``; ids are ``<plugin>-<server>``.

    A plugin with neither file (or no servers) contributes nothing. A bad ``plugin.json`` (unreadable, or
    a ``name`` other than the directory's) refuses the whole plugin; a server name that both files define
    is refused the second time.
    """
    plugin = directory.name
    context = Context("plugin", plugin)
    problems: list[ManifestProblem] = []
    try:
        sources, manifest = _plugin_sources(directory, context, problems)
    except _Invalid as exc:
        return [], [exc.problem]
    if any(servers for _, servers, _ in sources) and (fault := id_problem(plugin, "plugin name")):
        first = sources[0][0]
        return [], [ManifestProblem(first, f"{first}: {fault}")]
    version = manifest.version if manifest is not None else ""
    description = manifest.description if manifest is not None else ""
    specs: list[ConnectorSpec] = []
    seen: dict[str, Path] = {}
    for origin, servers, file_default in sources:
        for server, raw in servers.items():
            if is_disabled(raw):
                continue
            lines: list[str] = []
            if server in seen:
                lines.append(problem_line(str(origin), (*_SERVERS, server), f"already defined by {seen[server]}"))
            seen.setdefault(server, origin)
            entry = _entry(origin, server, raw, context, lines)
            if lines or entry is None:
                problems.append(_problem(origin, lines))
                continue
            specs.append(
                _server_spec(
                    f"{plugin}-{server}",
                    "plugin",
                    server,
                    entry,
                    origin,
                    file_default=file_default,
                    description=description,
                    version=version or None,
                    root=directory,
                    billing_manifest=_billing(directory),
                )
            )
    return specs, problems


# ---------------------------------------------------------------------------------------------- discovery


def _subdirs(base: Path, problems: list[ManifestProblem]) -> list[Path]:
    try:
        return sorted((child for child in base.iterdir() if child.is_dir()), key=lambda child: child.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.append(ManifestProblem(base, f"{base}: cannot list the directory ({exc.strerror})"))
        return []


def _collision(spec: ConnectorSpec, first: ConnectorSpec) -> ManifestProblem:
    where = ("id",) if spec.kind == "package" else (*_SERVERS, spec.name)
    taken = f"id {quote(spec.id)} is already taken by {first.origin}; refused"
    what = f"{taken} (ids are never renamed: rename one of them)"
    return ManifestProblem(spec.origin, problem_line(str(spec.origin), where, what))


def discover(
    *, package_dirs: Sequence[Path], user_config: Path, plugins_dir: Path
) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """Every connector from every source, and every problem; nothing broken hides anything else.

    Order, which also settles id collisions (the first wins, the rest are refused with a problem naming
    both files): each of ``package_dirs`` in turn (subdirectories with a ``connector.json``, by name),
    then ``user_config``, then the plugins in ``plugins_dir`` by name.
    """
    specs: list[ConnectorSpec] = []
    problems: list[ManifestProblem] = []
    taken: dict[str, ConnectorSpec] = {}

    def admit(found: Iterable[ConnectorSpec], trouble: Iterable[ManifestProblem] = ()) -> None:
        problems.extend(trouble)
        for spec in found:
            if (first := taken.get(spec.id)) is not None:
                problems.append(_collision(spec, first))
            else:
                taken[spec.id] = spec
                specs.append(spec)

    for base in package_dirs:
        for child in _subdirs(base, problems):
            if not os.path.lexists(child / CONNECTOR_FILE):
                continue
            try:
                admit([_package(child)])
            except _Invalid as exc:
                problems.append(exc.problem)
    admit(*load_user_servers(user_config))
    for child in _subdirs(plugins_dir, problems):
        admit(*load_plugin(child))
    return specs, problems
