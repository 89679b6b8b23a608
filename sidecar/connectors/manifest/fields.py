"""The values a connector manifest may hold: ids, strings, URLs, placeholders, names; each a checked type.

Each type here is a pydantic ``Annotated`` type whose validators state one rule and say what is wrong in
plain words (``sidecar.validation`` adds the file and field). Rules that depend on where a file sits read
the ``Context`` passed as pydantic's validation context: a package's id is its directory's name, a plugin's
server ids are ``<plugin>-<server>``, and ``${SIDECAR_CONNECTOR_ROOT}`` exists only for packages and plugins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, NoReturn
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, StringConstraints, ValidationInfo
from pydantic_core import PydanticKnownError

from sidecar.names import CONNECTOR_ID, MAX_TOOL_NAME, TOOL_NAME, connector_tool
from sidecar.origins import is_loopback_host
from sidecar.validation import quote

__all__ = [
    "ABSENT",
    "GIVEN",
    "MAX_ID_LENGTH",
    "PLACEHOLDERS",
    "ApiBaseUrl",
    "ClientSecret",
    "ClientSecretFile",
    "Command",
    "Context",
    "Cwd",
    "DeferLoading",
    "EnvName",
    "Headers",
    "HttpOnly",
    "InlineClientSecret",
    "LaunchText",
    "LaunchUrl",
    "MetadataDocumentUrl",
    "OneServer",
    "PackageId",
    "PluginName",
    "Prose",
    "Risk",
    "SandboxPath",
    "ScopeToken",
    "ServerName",
    "StdioOnly",
    "Text",
    "ToolName",
    "UnknownTransport",
    "Url",
    "context_of",
    "id_problem",
]

MAX_ID_LENGTH: Final = 32
"""An id becomes ``mcp__<id>__<tool>``, which hosts cap at 64 characters (anthropics/claude-code#2412)."""
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2 token
_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 §3.3 scope-token
_PLACEHOLDER: Final = re.compile(r"\$\{(SIDECAR_[A-Za-z0-9_]*)\}")
_MAX_TEXT: Final = 8192  # characters in one string (a description, an argument, a header value)

PLACEHOLDERS: Final = frozenset(
    {
        "SIDECAR_LOCAL_MCP_ORIGIN",
        "SIDECAR_LOCAL_MCP_AUTHORIZATION",
        "SIDECAR_MCP_CONTEXT",
        "SIDECAR_CONNECTOR_ROOT",
        "SIDECAR_PROJECT_DIR",
    }
)
"""``${NAME}`` placeholders expanded at spawn; any other ``${SIDECAR_...}`` is a typo."""
_ORIGIN: Final = "${SIDECAR_LOCAL_MCP_ORIGIN}"


@dataclass(frozen=True, slots=True)
class Context:
    """Where the file being validated sits; the validation ``context`` of every model here."""

    kind: Literal["package", "user", "plugin"]
    directory: str | None = None
    """The package's or plugin's directory name: a package's id, a plugin's name and id prefix."""

    @property
    def has_root(self) -> bool:
        """Packages and plugins have a directory, so ``${SIDECAR_CONNECTOR_ROOT}`` means something."""
        return self.kind != "user"


_USER: Final = Context("user")  # validation without a context gets the strictest rules


def context_of(info: ValidationInfo) -> Context:
    """The ``Context`` a validator runs in; without one, the strictest (a user's file)."""
    return info.context if isinstance(info.context, Context) else _USER


# ---------------------------------------------------------------------------------------------- rules


def id_problem(candidate: str, label: str) -> str | None:
    """Why ``candidate`` cannot be an id (``label`` names what it is), or ``None`` when it can."""
    if not CONNECTOR_ID.fullmatch(candidate):
        return (
            f"{label} {quote(candidate)} must be lowercase letters, digits, '-' and single '_' "
            "(no '__', no '_' at either end): it becomes mcp__<id>__<tool>"
        )
    if len(candidate) > MAX_ID_LENGTH:
        return f"{label} {quote(candidate)} is {len(candidate)} characters; the limit is {MAX_ID_LENGTH}"
    return None


def _clean(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    if not value.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise ValueError("is not valid Unicode (a lone surrogate)")
    return value


def _placeholders(value: str, info: ValidationInfo) -> str:
    for name in _PLACEHOLDER.findall(value):
        if name not in PLACEHOLDERS:
            known = ", ".join(sorted(PLACEHOLDERS))
            raise ValueError(f"unknown placeholder {quote('${' + name + '}')} (known: {known})")
        if name == "SIDECAR_CONNECTOR_ROOT" and not context_of(info).has_root:
            raise ValueError("${SIDECAR_CONNECTOR_ROOT} exists only for packages and plugins")
    return value


def _argv0(command: str) -> str:
    if command != command.strip():
        raise ValueError("must not start or end with spaces")
    words = command.split(maxsplit=1)
    if len(words) > 1 and "/" not in words[0] and "\\" not in words[0]:
        # No shell splits it (argv is command + args); a path such as "/opt/My App/run" may hold spaces.
        raise ValueError('has spaces but no shell splits it; put the arguments in "args"')
    return command


def _http_url(url: str, probe: str | None = None) -> str:
    """An http(s) URL with a host and no credentials; ``http://`` only to loopback. ``probe`` is what to parse."""
    try:
        parts = urlsplit(probe or url)
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise ValueError("must not contain spaces or control characters")
    if scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, got {quote(parts.scheme or '(none)')}")
    if not host:
        raise ValueError("has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (user:password@); send them in headers")
    if scheme == "http" and not is_loopback_host(host):
        # SECURITY: plain http leaves the machine readable and forgeable on the way; only loopback is exempt.
        raise ValueError(f"plain http is allowed only to loopback (127.0.0.1, [::1], localhost), not {quote(host)}")
    return url


def _launch_url(url: str) -> str:
    # The daemon's own origin is loopback http by construction; check the rest of the URL behind it.
    return _http_url(url, "http://127.0.0.1" + url.removeprefix(_ORIGIN) if url.startswith(_ORIGIN) else None)


def _api_base(url: str) -> str:
    if urlsplit(url).query or urlsplit(url).fragment:
        raise ValueError("must not have a query or a fragment")
    return url


def _metadata_document_url(url: str) -> str:
    # draft-ietf-oauth-client-id-metadata-document: the client id is an https URL with a path.
    parts = urlsplit(url)
    if parts.scheme.lower() != "https" or parts.path in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must be an https URL with a path and no query or fragment")
    return url


def _one_line(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("must not contain a line break")
    return value


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError("is not a valid variable name")
    return name


def _header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError("is not a valid header name")
    return name


def _one_case(headers: dict[str, str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for name in headers:
        if (other := seen.setdefault(name.lower(), name)) != name:
            raise ValueError(f"{quote(name)} repeats the header name {quote(other)} in another case")
    return headers


def _scope_token(scope: str) -> str:
    if not _SCOPE.fullmatch(scope):
        raise ValueError("is not a scope token (RFC 6749 §3.3: no spaces, quotes or backslashes)")
    return scope


def _tool_name(tool: str, info: ValidationInfo) -> str:
    if not TOOL_NAME.fullmatch(tool):
        raise ValueError(f"is not a valid tool name (1-{MAX_TOOL_NAME} of A-Z a-z 0-9 _ . -)")
    if len(full := connector_tool(info.data.get("id", ""), tool)) > MAX_TOOL_NAME:
        raise ValueError(f"{full} would be {len(full)} characters; the limit is {MAX_TOOL_NAME}")
    return tool


def _own_tool_name(tool: str) -> str:
    if not TOOL_NAME.fullmatch(tool):
        raise ValueError(f"is not a valid tool name (1-{MAX_TOOL_NAME} of A-Z a-z 0-9 _ . -)")
    return tool


def _distinct(tools: list[str]) -> list[str]:
    if len(set(tools)) != len(tools):
        raise ValueError("names a tool twice")
    return tools


def _server_name(name: str, info: ValidationInfo) -> str:
    """A user's server name is its id; a plugin's server id is ``<plugin>-<server>``; a package's is free."""
    context = context_of(info)
    if context.kind == "user" and (problem := id_problem(name, "server name")):
        raise ValueError(problem)
    if context.kind == "plugin" and (problem := id_problem(f"{context.directory}-{name}", "server id")):
        raise ValueError(problem)
    return name


def _not_null(value: object) -> object:
    if value is ABSENT:
        return None
    if value is None:
        raise PydanticKnownError("string_type")
    return value


def _not_for_stdio(value: object) -> NoReturn:
    raise ValueError('is not used by a stdio server (set "type": "http" for an HTTP server)')


def _not_for_http(value: object) -> NoReturn:
    raise ValueError("is not used by a http server")


def _no_such_transport(declared: object) -> NoReturn:
    if declared == "sse":
        raise ValueError('SSE transport is not supported; use Streamable HTTP ("type": "http")')
    raise ValueError(f'unknown transport {quote(declared)}; use "stdio" or "http"')


def _one_server(servers: dict[str, Any]) -> dict[str, Any]:
    if len(servers) != 1:
        listed = ", ".join(quote(name) for name in servers) or "none"
        raise ValueError(f"a package runs exactly one server; found {len(servers)} ({listed})")
    return servers


def _package_id(value: str, info: ValidationInfo) -> str:
    if problem := id_problem(value, "id"):
        raise ValueError(problem)
    directory = context_of(info).directory
    if directory is not None and value != directory:
        raise ValueError(f"{quote(value)} does not match the package directory {quote(directory)}")
    return value


def _public_client(value: object) -> NoReturn:
    # SECURITY: sidecar is a public client (PKCE S256, RFC 8252): a secret shipped in a package is no secret.
    raise ValueError("not allowed: sidecar uses PKCE as a public client; remove the secret")


def _secret_in_a_file(value: object) -> NoReturn:
    # SECURITY: mcp.json is read by agent hosts and copied around; a secret belongs in a file of its own.
    raise ValueError(
        'is not allowed inline: put the secret in a file only you can read and name that file in "clientSecretFile"'
    )


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    if _PLACEHOLDER.search(value):
        raise ValueError("must be a plain path, without placeholders")
    return value


def _plain_path(value: str) -> str:
    if any(part in (".", "..") for part in value.split("/")) or "//" in value or (value != "/" and value.endswith("/")):
        raise ValueError("must be a normalised path: no '.', '..', '//' or trailing '/'")
    return value


def _names_its_directory(name: str, info: ValidationInfo) -> str:
    # SECURITY: the directory names the plugin and prefixes its ids; the manifest may not claim another.
    directory = context_of(info).directory
    if directory is not None and name != directory:
        raise ValueError(f"{quote(name)} does not match the plugin directory {quote(directory)}")
    return name


# ---------------------------------------------------------------------------------------------- types

Text = Annotated[str, StringConstraints(min_length=1, max_length=_MAX_TEXT), AfterValidator(_clean)]
"""One string: not empty, at most ``_MAX_TEXT`` characters, no NUL, no lone surrogate."""
Prose = Annotated[str, StringConstraints(max_length=_MAX_TEXT), AfterValidator(_clean)]
"""Like ``Text`` but may be empty (a description, an example, an argument, an env value)."""
LaunchText = Annotated[Prose, AfterValidator(_placeholders)]
"""An argument or an env value: known placeholders only."""
Command = Annotated[Text, AfterValidator(_argv0), AfterValidator(_placeholders)]
"""argv[0], never parsed by a shell."""
Cwd = Annotated[Text, AfterValidator(_placeholders)]
Url = Annotated[Text, AfterValidator(_http_url)]
"""``https://`` anywhere, ``http://`` only to a loopback host; no placeholders (``oauth-client.json``)."""
ApiBaseUrl = Annotated[Url, AfterValidator(_api_base)]
MetadataDocumentUrl = Annotated[Url, AfterValidator(_metadata_document_url)]
LaunchUrl = Annotated[Text, AfterValidator(_placeholders), AfterValidator(_launch_url)]
"""A server's URL: like ``Url``, and may start with the daemon's own origin placeholder."""
EnvName = Annotated[str, AfterValidator(_env_name)]
HeaderName = Annotated[str, AfterValidator(_header_name)]
HeaderValue = Annotated[Prose, AfterValidator(_one_line), AfterValidator(_placeholders)]
Headers = Annotated[dict[HeaderName, HeaderValue], AfterValidator(_one_case)]
"""Header names are case-insensitive: one name given twice in two cases is refused."""
ScopeToken = Annotated[str, AfterValidator(_scope_token)]
ToolName = Annotated[str, AfterValidator(_tool_name)]
"""A key of ``connector.json``'s ``tools``; reads the ``id`` validated before it."""
DeferLoading = bool | Annotated[list[Annotated[str, AfterValidator(_own_tool_name)]], AfterValidator(_distinct)]
"""``defer_loading``: ``true`` defers every tool of the server, ``false`` none, a list those tools (the
server's own names); the others are listed directly."""
ServerName = Annotated[str, AfterValidator(_server_name)]
"""A key of ``mcpServers``: the id of a user's server, the suffix of a plugin's, free in a package."""
PackageId = Annotated[Text, AfterValidator(_package_id)]
PluginName = Annotated[Text, AfterValidator(_names_its_directory)]
Risk = Literal["LOW", "MEDIUM", "HIGH"]
OneServer = Annotated[dict[str, Any], AfterValidator(_one_server)]
StdioOnly = Annotated[None, BeforeValidator(_not_for_http)]
"""A stdio key in an HTTP entry: refused whenever present (the default ``None`` is not validated)."""
HttpOnly = Annotated[None, BeforeValidator(_not_for_stdio)]
"""An HTTP key in a stdio entry: refused whenever present."""
UnknownTransport = Annotated[Any, AfterValidator(_no_such_transport)]
"""The ``type`` of an entry sidecar cannot run: always refused, naming SSE or the unknown name."""
ClientSecret = Annotated[None, BeforeValidator(_public_client)]
"""Refused whenever present; its value is never read nor repeated."""
InlineClientSecret = Annotated[None, BeforeValidator(_secret_in_a_file)]
"""``clientSecret`` in an entry's ``oauth``: refused whenever present, pointing at ``clientSecretFile``."""
ClientSecretFile = Annotated[Text, AfterValidator(_absolute_path)]
"""The absolute path of the file holding a pre-registered client's secret (read at sign-in, never copied)."""
SandboxPath = Annotated[Text, AfterValidator(_absolute_path), AfterValidator(_plain_path)]
"""A path a connector's sandbox shows it (``readPaths``, ``writePaths``): absolute and normalised."""
GIVEN: Final = BeforeValidator(_not_null)
"""On ``X | None = None``: the key may be left out, but ``null`` is not a way to leave it out."""
ABSENT: Final[Any] = object()
"""The default of a ``GIVEN`` key whose absence a rule checks (``validate_default``); it validates to ``None``."""
