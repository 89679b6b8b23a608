"""Connector manifests: every source read and validated into one ``ConnectorSpec`` (SPEC §1, §5, §6).

Sources, in the order that settles id collisions:

1. packages: ``<dir>/<id>/connector.json`` + ``mcp.json`` (exactly one server) [+ ``oauth-client.json``];
2. the user's servers: ``<config>/mcp.json``, ``{"mcpServers": {name: entry}}``;
3. plugins: ``<data>/plugins/<name>/plugin.json`` and/or its ``.mcp.json``; ids are ``<plugin>-<server>``.

An entry has the shape Claude Code and Cursor write: stdio ``{"command", "args", "env", "cwd", "type"?}`` or
Streamable HTTP ``{"type": "http", "url", "headers"}``. Validation is strict (an unknown key is refused, since
a typo must not be ignored) except for a few keys hosts add (``disabled``, ``autoApprove``...), which are
ignored; ``"disabled": true`` skips the server.

Every problem names the file and the field, ``<path>: <field>: <what>`` (a whole-file problem reads
``<path>: <what>``). One broken entry, file or package never hides the others. An id that is already taken
is refused and never renamed (users.md §4 item 7). Files are read through ``store.files`` (no symlink, the
user's own, not writable by others) and parsed strictly (no NaN, no duplicate keys).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from sidecar.errors import ConfigError, StorageError
from sidecar.store.files import loads_strict, read_private

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

MAX_ID_LENGTH: Final = 32
"""An id becomes ``mcp__<id>__<tool>``, which hosts cap at 64 characters (anthropics/claude-code#2412)."""
# Lowercase, no "__" and no "_" at either end, so that mcp__<id>__<tool> splits one way only (SPEC §6).
_ID: Final = re.compile(r"[a-z0-9][a-z0-9-]*(?:_[a-z0-9-]+)*")
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2 token
_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 §3.3 scope-token
_PLACEHOLDER: Final = re.compile(r"\$\{(SIDECAR_[A-Za-z0-9_]*)\}")

PLACEHOLDERS: Final = frozenset(
    {
        "SIDECAR_LOCAL_MCP_ORIGIN",
        "SIDECAR_LOCAL_MCP_AUTHORIZATION",
        "SIDECAR_MCP_CONTEXT",
        "SIDECAR_CONNECTOR_ROOT",
        "SIDECAR_PROJECT_DIR",
    }
)
"""``${NAME}`` placeholders expanded at spawn (SPEC §5); any other ``${SIDECAR_...}`` is a typo."""
_ORIGIN: Final = "${SIDECAR_LOCAL_MCP_ORIGIN}"
_RISKS: Final = ("LOW", "MEDIUM", "HIGH")

_MAX_FILE_BYTES: Final = 1024 * 1024  # a manifest is a few KiB; anything near this is a mistake
_MAX_TEXT: Final = 8192  # characters in one string (a description, an argument, a header value)
_MAX_QUOTE: Final = 64  # characters of a bad key or value quoted back in a message

_STDIO_KEYS: Final = frozenset({"type", "command", "args", "env", "cwd"})
_HTTP_KEYS: Final = frozenset({"type", "url", "headers"})
_HOST_KEYS: Final = frozenset({"disabled", "autoApprove", "alwaysAllow", "timeout", "description"})
"""Keys agent hosts add to an entry; accepted and ignored (``disabled: true`` skips the entry)."""
_CONNECTOR_KEYS: Final = frozenset(
    {"$schema", "id", "name", "description", "examples", "version", "type", "source", "tools"}
)
_OAUTH_KEYS: Final = frozenset(
    {
        "$schema",
        "metadata_url",
        "authorization_endpoint",
        "token_endpoint",
        "revocation_endpoint",
        "client_id",
        "scopes",
        "api_base_url",
        "resource",
    }
)
_OAUTH_URLS: Final = ("metadata_url", "authorization_endpoint", "token_endpoint", "revocation_endpoint", "resource")
_PLUGIN_KEYS: Final = frozenset({"$schema", "name", "version", "description", "mcpServers"})
# Claude Code plugin metadata that sidecar does not use; accepted so that one plugin directory serves both.
_PLUGIN_METADATA: Final = frozenset(
    {"author", "homepage", "repository", "license", "keywords", "commands", "agents", "hooks", "skills"}
)
_SERVERS_FILE_KEYS: Final = frozenset({"$schema", "mcpServers"})


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


@dataclass(frozen=True, slots=True)
class ConnectorSpec:
    """One connector from any source, validated; trust is keyed on it (``trustkey.trust_key``)."""

    id: str
    """The server name in ``mcp__<id>__<tool>``: ``_ID``, at most ``MAX_ID_LENGTH`` characters."""
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
    oauth: Mapping[str, Any] | None
    """Validated ``oauth-client.json``: every key of ``_OAUTH_KEYS`` but ``$schema`` (``None`` when absent)."""
    billing_manifest: Path | None
    """``<root>/high-credit-tools.json`` when it exists (the billing gate validates it, failing closed)."""


@dataclass(frozen=True, slots=True)
class ManifestProblem:
    """A file, entry or package that was refused; ``message`` is ``<path>: <field>: <what>``."""

    path: Path
    message: str

    def __str__(self) -> str:
        return self.message


class _Invalid(Exception):
    """Internal: carries the problem (with its path) out of a loader; the public API maps it."""

    def __init__(self, problem: ManifestProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _Faults:
    """Every fault found in one unit (an entry, a file); they become a single problem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        self.items.append(f"{where}: {what}" if where else what)

    def __bool__(self) -> bool:
        return bool(self.items)

    def problem(self) -> ManifestProblem:
        return ManifestProblem(self.path, f"{self.path}: " + "; ".join(self.items))

    def raise_any(self) -> None:
        if self.items:
            raise _Invalid(self.problem())


def _quote(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > _MAX_QUOTE:
        text = text[:_MAX_QUOTE] + "…"
    return repr(text)


def _key(where: str, key: str) -> str:
    """The field path of ``key`` inside ``where``; an odd key is quoted (``mcpServers['a b']``)."""
    if not (_TOOL_NAME.fullmatch(key) and "." not in key):
        return f"{where}[{_quote(key)}]"
    return f"{where}.{key}" if where else key


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


# ---------------------------------------------------------------------------------------------- reading


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


# ---------------------------------------------------------------------------------------------- values


def _text(value: object, where: str, faults: _Faults, *, empty: bool = False) -> str | None:
    if not isinstance(value, str):
        faults.add(where, f"must be a string, got {_kind(value)}")
    elif not value and not empty:
        faults.add(where, "must not be empty")
    elif len(value) > _MAX_TEXT:
        faults.add(where, f"is {len(value)} characters; the limit is {_MAX_TEXT}")
    elif "\x00" in value:
        faults.add(where, "must not contain a NUL character")
    elif not value.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        faults.add(where, "is not valid Unicode (a lone surrogate)")
    else:
        return value
    return None


def _placeholders(value: str, where: str, faults: _Faults, *, has_root: bool) -> None:
    for name in _PLACEHOLDER.findall(value):
        if name not in PLACEHOLDERS:
            faults.add(where, f"unknown placeholder ${{{name}}} (known: {', '.join(sorted(PLACEHOLDERS))})")
        elif name == "SIDECAR_CONNECTOR_ROOT" and not has_root:
            faults.add(where, "${SIDECAR_CONNECTOR_ROOT} exists only for packages and plugins")


def _strings(value: object, where: str, faults: _Faults, *, has_root: bool | None) -> tuple[str, ...] | None:
    """A list of strings; ``has_root=None``: prose, not launch config, so placeholders are not checked."""
    if not isinstance(value, list):
        faults.add(where, f"must be a list of strings, got {_kind(value)}")
        return None
    before = len(faults.items)
    items: list[str] = []
    for i, item in enumerate(value):
        text = _text(item, f"{where}[{i}]", faults, empty=True)
        if text is not None:
            if has_root is not None:
                _placeholders(text, f"{where}[{i}]", faults, has_root=has_root)
            items.append(text)
    return tuple(items) if len(faults.items) == before else None


def _string_map(value: object, where: str, faults: _Faults, *, headers: bool, has_root: bool) -> dict[str, str] | None:
    """``env`` (``headers=False``) or ``headers``: names checked, values strings (header values one line)."""
    names, what = (_HEADER_NAME, "header name") if headers else (_ENV_NAME, "variable name")
    if not isinstance(value, dict):
        faults.add(where, f"must be an object of strings, got {_kind(value)}")
        return None
    result: dict[str, str] = {}
    folded: set[str] = set()
    before = len(faults.items)
    for key, item in value.items():
        at = _key(where, key)
        if not names.fullmatch(key):
            faults.add(at, f"is not a valid {what}")
        elif headers and key.lower() in folded:
            faults.add(at, "repeats a header name given in another case")
        text = _text(item, at, faults, empty=True)
        if text is None:
            continue
        if headers and ("\r" in text or "\n" in text):
            faults.add(at, "must not contain a line break")
        _placeholders(text, at, faults, has_root=has_root)
        result[key] = text
        folded.add(key.lower())
    return result if len(faults.items) == before else None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(value: object, where: str, faults: _Faults, *, has_root: bool | None) -> str | None:
    """An http(s) URL; ``has_root=None`` means no placeholders may appear (``oauth-client.json``)."""
    url = _text(value, where, faults)
    if url is None:
        return None
    before = len(faults.items)
    probe = url
    if has_root is not None:
        _placeholders(url, where, faults, has_root=has_root)
        if url.startswith(_ORIGIN):  # the daemon's own origin: loopback http by construction
            probe = "http://127.0.0.1" + url.removeprefix(_ORIGIN)
    try:
        parts = urlsplit(probe)
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        faults.add(where, f"is not a valid URL ({exc})")
        return None
    scheme = parts.scheme.lower()
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        faults.add(where, "must not contain spaces or control characters")
    elif scheme not in ("http", "https"):
        faults.add(where, f"scheme must be http or https, got {_quote(parts.scheme or '(none)')}")
    elif not host:
        faults.add(where, "has no host")
    elif parts.username is not None or parts.password is not None:
        faults.add(where, "must not carry credentials (user:password@); send them in headers")
    elif scheme == "http" and not _loopback(host):
        # SECURITY: plain http leaves the machine readable and forgeable on the way; only loopback is exempt.
        faults.add(where, f"plain http is allowed only to loopback (127.0.0.1, [::1], localhost), not {_quote(host)}")
    return url if len(faults.items) == before else None


# ---------------------------------------------------------------------------------------------- entries


def _id_fault(candidate: str, label: str = "id") -> str | None:
    if not _ID.fullmatch(candidate):
        return (
            f"{label} {_quote(candidate)} must be lowercase letters, digits, '-' and single '_' "
            "(no '__', no '_' at either end): it becomes mcp__<id>__<tool>"
        )
    if len(candidate) > MAX_ID_LENGTH:
        return f"{label} {_quote(candidate)} is {len(candidate)} characters; the limit is {MAX_ID_LENGTH}"
    return None


def _disabled(raw: object, where: str, faults: _Faults) -> bool:
    if not isinstance(raw, dict) or "disabled" not in raw:
        return False
    if not isinstance(raw["disabled"], bool):
        faults.add(f"{where}.disabled", f"must be true or false, got {_kind(raw['disabled'])}")
        return False
    return raw["disabled"]


def _transport(raw: dict[str, Any], where: str, faults: _Faults) -> Literal["stdio", "http"] | None:
    declared = raw.get("type")
    if declared is None:
        return "http" if "url" in raw and "command" not in raw else "stdio"
    if declared == "stdio":
        return "stdio"
    if declared in ("http", "streamable-http"):
        return "http"
    if declared == "sse":
        faults.add(f"{where}.type", 'SSE transport is not supported; use Streamable HTTP ("type": "http")')
    else:
        faults.add(f"{where}.type", f'unknown transport {_quote(declared)}; use "stdio" or "http"')
    return None


def _unknown_keys(data: Mapping[str, Any], allowed: Iterable[str], where: str, faults: _Faults) -> None:
    known = set(allowed)
    for key in data:
        if key not in known:
            faults.add(_key(where, key), "unknown key (a typo?)")


def _http(raw: dict[str, Any], where: str, faults: _Faults, *, has_root: bool) -> LaunchConfig | None:
    url = None
    if "url" not in raw:
        faults.add(f"{where}.url", "missing: an http server needs a url")
    else:
        url = _url(raw["url"], f"{where}.url", faults, has_root=has_root)
    headers = _string_map(raw.get("headers", {}), f"{where}.headers", faults, headers=True, has_root=has_root)
    if faults or url is None or headers is None:
        return None
    return LaunchConfig("http", None, (), MappingProxyType({}), None, url, MappingProxyType(headers))


def _stdio(raw: dict[str, Any], where: str, faults: _Faults, *, has_root: bool) -> LaunchConfig | None:
    command = None
    if "command" not in raw:
        faults.add(f"{where}.command", "missing: a stdio server needs a command (argv[0], run without a shell)")
    elif (command := _text(raw["command"], f"{where}.command", faults)) is not None:
        words = command.split(maxsplit=1)
        if command != command.strip():
            faults.add(f"{where}.command", "must not start or end with spaces")
        elif len(words) > 1 and "/" not in words[0] and "\\" not in words[0]:
            # No shell splits it (argv is command + args); a path such as "/opt/My App/run" may hold spaces.
            faults.add(f"{where}.command", 'has spaces but no shell splits it; put the arguments in "args"')
        _placeholders(command, f"{where}.command", faults, has_root=has_root)
    args = _strings(raw.get("args", []), f"{where}.args", faults, has_root=has_root)
    env = _string_map(raw.get("env", {}), f"{where}.env", faults, headers=False, has_root=has_root)
    cwd = _text(raw["cwd"], f"{where}.cwd", faults) if "cwd" in raw else None
    if cwd is not None:
        _placeholders(cwd, f"{where}.cwd", faults, has_root=has_root)
    if faults or command is None or args is None or env is None:
        return None
    return LaunchConfig("stdio", command, args, MappingProxyType(env), cwd, None, MappingProxyType({}))


def _launch(raw: object, where: str, faults: _Faults, *, has_root: bool) -> LaunchConfig | None:
    """Validate one ``mcpServers`` entry into a ``LaunchConfig`` (``None`` when it has faults)."""
    if not isinstance(raw, dict):
        faults.add(where, f"must be an object, got {_kind(raw)}")
        return None
    transport = _transport(raw, where, faults)
    if transport is None:
        return None
    own, other = (_STDIO_KEYS, _HTTP_KEYS) if transport == "stdio" else (_HTTP_KEYS, _STDIO_KEYS)
    hint = ' (set "type": "http" for an HTTP server)' if transport == "stdio" else ""
    for key in raw:
        if key in other and key not in own:
            faults.add(_key(where, key), f"is not used by a {transport} server{hint}")
    _unknown_keys(raw, own | other | _HOST_KEYS, where, faults)
    if transport == "http":
        return _http(raw, where, faults, has_root=has_root)
    return _stdio(raw, where, faults, has_root=has_root)


def _servers(
    data: object,
    faults: _Faults,
    *,
    allowed: frozenset[str] = _SERVERS_FILE_KEYS,
    ignored: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The ``mcpServers`` object of a file; top-level faults go to ``faults`` and hide no entry."""
    if not isinstance(data, dict):
        faults.add("", f"the top level must be an object, got {_kind(data)}")
        return {}
    _unknown_keys(data, allowed | ignored, "", faults)
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        faults.add("mcpServers", f"must be an object of servers, got {_kind(servers)}")
        return {}
    return servers


def _entries(
    path: Path, servers: Mapping[str, Any], make: Callable[[str, object, str, _Faults], ConnectorSpec | None]
) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """Each entry on its own: ``make(name, raw, where, faults)`` builds a spec or records its faults."""
    specs: list[ConnectorSpec] = []
    problems: list[ManifestProblem] = []
    for name, raw in servers.items():
        where = _key("mcpServers", name)
        faults = _Faults(path)
        if _disabled(raw, where, faults):
            continue
        spec = make(name, raw, where, faults)
        if faults or spec is None:
            problems.append(faults.problem())
        else:
            specs.append(spec)
    return specs, problems


# ---------------------------------------------------------------------------------------------- packages


def _billing(root: Path) -> Path | None:
    path = root / BILLING_FILE
    return path if os.path.lexists(path) else None


def _tool_risks(value: object, spec_id: str, faults: _Faults) -> dict[str, str]:
    risks: dict[str, str] = {}
    if not isinstance(value, dict):
        faults.add("tools", f"must be an object of tools, got {_kind(value)}")
        return risks
    for tool, entry in value.items():
        at = _key("tools", tool)
        if not _TOOL_NAME.fullmatch(tool):
            faults.add(at, "is not a valid tool name (1-64 of A-Z a-z 0-9 _ . -)")
        elif len(full := f"mcp__{spec_id}__{tool}") > 64:
            faults.add(at, f"{full} would be {len(full)} characters; the limit is 64")
        if not isinstance(entry, dict):
            faults.add(at, f'must be an object like {{"risk": "LOW"}}, got {_kind(entry)}')
            continue
        _unknown_keys(entry, ("risk",), at, faults)
        risk = entry.get("risk")
        if risk not in _RISKS:
            faults.add(f"{at}.risk", f"must be one of {', '.join(_RISKS)}, got {_quote(risk)}")
        else:
            risks[tool] = risk
    return risks


def _oauth_endpoints(data: Mapping[str, Any], faults: _Faults) -> dict[str, Any]:
    """Where the authorization server is: its RFC 8414 metadata URL, or its endpoints; https or loopback."""
    found = {key: _url(data[key], key, faults, has_root=None) if key in data else None for key in _OAUTH_URLS}
    if "metadata_url" in data and ("authorization_endpoint" in data or "token_endpoint" in data):
        faults.add("metadata_url", "give either metadata_url or authorization_endpoint + token_endpoint, not both")
    elif "metadata_url" not in data:
        for key in ("authorization_endpoint", "token_endpoint"):
            if key not in data:
                faults.add(key, "missing (or give metadata_url for RFC 8414 discovery)")
    return found


def _oauth(data: object, faults: _Faults) -> Mapping[str, Any] | None:
    if not isinstance(data, dict):
        faults.add("", f"the top level must be an object, got {_kind(data)}")
        return None
    if "client_secret" in data:
        # SECURITY: sidecar is a public client (PKCE S256, RFC 8252): a secret shipped in a package is no secret.
        faults.add("client_secret", "not allowed: sidecar uses PKCE as a public client; remove the secret")
    _unknown_keys(data, _OAUTH_KEYS | {"client_secret"}, "", faults)
    result = _oauth_endpoints(data, faults)
    for key in ("client_id", "api_base_url"):
        if key not in data:
            faults.add(key, "missing")
    result["client_id"] = _text(data["client_id"], "client_id", faults) if "client_id" in data else None
    base = _url(data["api_base_url"], "api_base_url", faults, has_root=None) if "api_base_url" in data else None
    if base is not None and (urlsplit(base).query or urlsplit(base).fragment):
        faults.add("api_base_url", "must not have a query or a fragment")
    result["api_base_url"] = base
    scopes = data.get("scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) and _SCOPE.fullmatch(s) for s in scopes):
        faults.add("scopes", "must be a list of scope tokens (RFC 6749 §3.3: no spaces, quotes or backslashes)")
    result["scopes"] = tuple(scopes) if isinstance(scopes, list) else ()
    return None if faults else MappingProxyType(result)


def _connector_json(path: Path, directory: Path) -> dict[str, Any]:
    """``connector.json`` → the keyword arguments of ``ConnectorSpec`` it decides."""
    data = _read_required(path, "a connector package needs connector.json")
    faults = _Faults(path)
    if not isinstance(data, dict):
        faults.add("", f"the top level must be an object, got {_kind(data)}")
        raise _Invalid(faults.problem())
    _unknown_keys(data, _CONNECTOR_KEYS, "", faults)
    for key in ("id", "name", "type"):
        if key not in data:
            faults.add(key, "missing")
    spec_id = _text(data["id"], "id", faults) if "id" in data else None
    if spec_id is not None:
        if fault := _id_fault(spec_id):
            faults.add("id", fault)
        elif spec_id != directory.name:
            faults.add("id", f"{_quote(spec_id)} does not match the package directory {_quote(directory.name)}")
    if "type" in data and data["type"] != "mcp":
        faults.add("type", f'must be "mcp", got {_quote(data["type"])}')
    if data.get("source") is not None:
        _text(data["source"], "source", faults)
    fields = {
        "id": spec_id,
        "name": _text(data["name"], "name", faults) if "name" in data else None,
        "description": _text(data.get("description", ""), "description", faults, empty=True),
        "version": _text(data["version"], "version", faults) if data.get("version") is not None else None,
        "examples": _strings(data.get("examples", []), "examples", faults, has_root=None),
        "tool_risks": MappingProxyType(_tool_risks(data.get("tools", {}), spec_id or "", faults)),
    }
    faults.raise_any()
    return fields


def _package_launch(path: Path) -> LaunchConfig:
    faults = _Faults(path)
    servers = _servers(_read_required(path, "a connector package needs mcp.json with its one server"), faults)
    if len(servers) != 1:
        listed = ", ".join(_quote(s) for s in servers) or "none"
        faults.add("mcpServers", f"a package runs exactly one server; found {len(servers)} ({listed})")
        raise _Invalid(faults.problem())
    ((server, raw),) = servers.items()
    where = _key("mcpServers", server)
    if _disabled(raw, where, faults):
        faults.add(f"{where}.disabled", "a package's server cannot be disabled; untrust or remove the package")
    launch = _launch(raw, where, faults, has_root=True)
    if faults or launch is None:
        raise _Invalid(faults.problem())
    return launch


def _package(directory: Path) -> ConnectorSpec:
    origin = directory / CONNECTOR_FILE
    fields = _connector_json(origin, directory)
    launch = _package_launch(directory / LAUNCH_FILE)
    oauth = None
    oauth_path = directory / OAUTH_FILE
    if os.path.lexists(oauth_path):
        faults = _Faults(oauth_path)
        oauth = _oauth(_read_required(oauth_path, "it vanished while being read"), faults)
        faults.raise_any()
    return ConnectorSpec(
        kind="package",
        launch=launch,
        root=directory,
        origin=origin,
        oauth=oauth,
        billing_manifest=_billing(directory),
        **fields,
    )


def load_package(directory: Path) -> ConnectorSpec:
    """Load the package in ``directory``; ``ConfigError`` names the file and field of the first bad file."""
    try:
        return _package(directory)
    except _Invalid as exc:
        raise ConfigError(exc.problem.message) from exc


# ---------------------------------------------------------------------------------------------- user, plugins


def _server_spec(
    spec_id: str, kind: Literal["user", "plugin"], name: str, launch: LaunchConfig, origin: Path, **extra: Any
) -> ConnectorSpec:
    """A spec for a server without a package: no tool risks (defaults apply), no OAuth client."""
    fields: dict[str, Any] = {"description": "", "version": None, "root": None, "billing_manifest": None}
    fields.update(extra)
    return ConnectorSpec(
        id=spec_id,
        kind=kind,
        name=name,
        examples=(),
        launch=launch,
        origin=origin,
        tool_risks=MappingProxyType({}),
        oauth=None,
        **fields,
    )


def load_user_servers(path: Path) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """The user's ``mcp.json``: each entry validated on its own. A missing file means no servers."""
    try:
        data = _read(path)
    except FileNotFoundError:
        return [], []
    except _Invalid as exc:
        return [], [exc.problem]
    top = _Faults(path)
    servers = _servers(data, top)

    def make(name: str, raw: object, where: str, faults: _Faults) -> ConnectorSpec | None:
        if fault := _id_fault(name, "server name"):
            faults.add(where, fault)
        launch = _launch(raw, where, faults, has_root=False)
        return None if launch is None else _server_spec(name, "user", name, launch, path)

    specs, problems = _entries(path, servers, make)
    return specs, ([top.problem()] if top else []) + problems


def _plugin_manifest(path: Path, plugin: str, problems: list[ManifestProblem]) -> tuple[dict[str, Any], str, str]:
    """``plugin.json`` → (servers, version, description); an identity problem refuses the whole plugin."""
    data = _read(path)
    faults = _Faults(path)
    servers = _servers(data, faults, allowed=_PLUGIN_KEYS, ignored=_PLUGIN_METADATA)
    if not isinstance(data, dict):
        raise _Invalid(faults.problem())
    if "name" in data and data["name"] != plugin:
        # SECURITY: the directory names the plugin and prefixes its ids; the manifest may not claim another.
        faults.add("name", f"{_quote(data['name'])} does not match the plugin directory {_quote(plugin)}")
        raise _Invalid(faults.problem())
    version = _text(data.get("version", ""), "version", faults, empty=True) or ""
    description = _text(data.get("description", ""), "description", faults, empty=True) or ""
    if faults:
        problems.append(faults.problem())
    return servers, version, description


def load_plugin(directory: Path) -> tuple[list[ConnectorSpec], list[ManifestProblem]]:
    """A plugin's servers from ``plugin.json`` then ``.mcp.json``; ids are ``<plugin>-<server>``.

    A plugin with neither file (or no servers) contributes nothing. A bad ``plugin.json`` (unreadable, or
    a ``name`` other than the directory's) refuses the whole plugin; a server name that both files define
    is refused the second time.
    """
    plugin = directory.name
    problems: list[ManifestProblem] = []
    version, description = "", ""
    sources: list[tuple[Path, dict[str, Any]]] = []
    try:
        servers, version, description = _plugin_manifest(directory / PLUGIN_FILE, plugin, problems)
        sources.append((directory / PLUGIN_FILE, servers))
    except FileNotFoundError:
        pass
    except _Invalid as exc:
        return [], [exc.problem]
    launch_path = directory / PLUGIN_LAUNCH_FILE
    try:
        top = _Faults(launch_path)
        sources.append((launch_path, _servers(_read(launch_path), top)))
        problems.extend([top.problem()] if top else [])
    except FileNotFoundError:
        pass
    except _Invalid as exc:
        problems.append(exc.problem)
    if any(servers for _, servers in sources) and (fault := _id_fault(plugin, "plugin name")):
        first = sources[0][0]
        return [], [ManifestProblem(first, f"{first}: {fault}")]

    seen: dict[str, Path] = {}

    def make(server: str, raw: object, where: str, faults: _Faults) -> ConnectorSpec | None:
        spec_id = f"{plugin}-{server}"
        if server in seen:
            faults.add(where, f"already defined by {seen[server]}")
        elif fault := _id_fault(spec_id, "server id"):
            faults.add(where, fault)
        seen.setdefault(server, faults.path)
        launch = _launch(raw, where, faults, has_root=True)
        if launch is None:
            return None
        return _server_spec(
            spec_id,
            "plugin",
            server,
            launch,
            faults.path,
            description=description,
            version=version or None,
            root=directory,
            billing_manifest=_billing(directory),
        )

    specs: list[ConnectorSpec] = []
    for origin, servers in sources:
        found, trouble = _entries(origin, servers, make)
        specs.extend(found)
        problems.extend(trouble)
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
    where = "id" if spec.kind == "package" else _key("mcpServers", spec.name)
    return ManifestProblem(
        spec.origin,
        f"{spec.origin}: {where}: id {_quote(spec.id)} is already taken by {first.origin}; refused "
        "(ids are never renamed: rename one of them)",
    )


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
