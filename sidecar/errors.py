"""The one error tree of sidecar. Each edge (HTTP, JSON-RPC, tool results, CLI) maps it in one place.

::

    SidecarError                      status  code
    ├── ConfigError                     500   config_error        bad settings or manifest (names file/field)
    ├── StorageError                    500   storage_error       a file is unsafe or unreadable
    ├── RequestRejected                 400   bad_request         the request itself is malformed
    │   ├── BodyTooLarge                413   body_too_large
    │   ├── BodyTooDeep                 400   body_too_deep
    │   ├── MalformedJson               400   parse_error         not JSON, NaN, a member named twice
    │   ├── ReadTimedOut                408   read_timeout
    │   └── UnsupportedMediaType        415   unsupported_media_type
    ├── Forbidden                       403   forbidden           network guard, envelope, policy
    │   ├── HostRejected                403   host_not_allowed
    │   ├── OriginRejected              403   origin_not_allowed
    │   ├── FetchSiteRejected           403   cross_site_request
    │   └── EnvelopeRejected            403   invalid_session
    ├── Unauthorized                    401   unauthorized        missing or wrong bearer token
    ├── NotFound                        404   not_found
    ├── Conflict                        409   conflict            e.g. a second daemon on one home
    │   └── StaleGrant                  409   stale_grant         a credential write for a grant revoked since it began
    ├── AuthorizationRefused            502   authorization_refused  an OAuth server we will not sign in to
    ├── UpstreamFailed                  502   upstream_failed     a connector's upstream API (internal API)
    └── ToolError                       --    tool_error          becomes an MCP result with isError

No module here imports aiohttp: the mapping to responses lives at the edges (``sidecar/http.py``).
Messages are safe to show to the client: they never carry a secret, a path outside the user's own
files, or a traceback. A refusal of something the client sent (a Host, an Origin, a token, an envelope,
a request target) says what is wrong with it, never the bytes themselves: those go in ``sent``, which
only the log line shows (contract §3; issue 11 item 3).
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

__all__ = [
    "AuthorizationRefused",
    "BodyTooDeep",
    "BodyTooLarge",
    "ConfigError",
    "Conflict",
    "EnvelopeRejected",
    "FetchSiteRejected",
    "Forbidden",
    "HostRejected",
    "MalformedJson",
    "NotFound",
    "OriginRejected",
    "ReadTimedOut",
    "RequestRejected",
    "SidecarError",
    "StaleGrant",
    "StorageError",
    "ToolError",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpstreamFailed",
    "find_error",
]


class SidecarError(Exception):
    """Base of every error sidecar raises on purpose. ``str(err)`` is safe to show to a client."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str = "", *, sent: str | None = None) -> None:
        super().__init__(message)
        self.sent = sent
        """What the client sent that was refused, already previewed (escaped, bounded): for the log line
        only. Never rendered into a response."""


class ConfigError(SidecarError):
    code = "config_error"


class StorageError(SidecarError):
    code = "storage_error"


class RequestRejected(SidecarError):
    status = 400
    code = "bad_request"


class BodyTooLarge(RequestRejected):
    status = 413
    code = "body_too_large"


class BodyTooDeep(RequestRejected):
    code = "body_too_deep"


class MalformedJson(RequestRejected):
    code = "parse_error"


class ReadTimedOut(RequestRejected):
    status = 408
    code = "read_timeout"


class UnsupportedMediaType(RequestRejected):
    status = 415
    code = "unsupported_media_type"


class Forbidden(SidecarError):
    status = 403
    code = "forbidden"


class HostRejected(Forbidden):
    code = "host_not_allowed"


class OriginRejected(Forbidden):
    code = "origin_not_allowed"


class FetchSiteRejected(Forbidden):
    code = "cross_site_request"


class EnvelopeRejected(Forbidden):
    code = "invalid_session"


class Unauthorized(SidecarError):
    status = 401
    code = "unauthorized"


class NotFound(SidecarError):
    status = 404
    code = "not_found"


class Conflict(SidecarError):
    status = 409
    code = "conflict"


class StaleGrant(Conflict):
    """A write to the credential store for a connector's grant that was revoked since the write's work
    began (a refresh, a sign-in): refused, so a revoke always wins (issue 24)."""

    code = "stale_grant"


class AuthorizationRefused(SidecarError):
    """We will not authorize against this server (unsafe metadata or URL), or it gave no code."""

    status = 502
    code = "authorization_refused"


class UpstreamFailed(SidecarError):
    """A connector's upstream API did not answer usably through the internal API (unreachable, slow, too large)."""

    status = 502
    code = "upstream_failed"


class ToolError(SidecarError):
    """A tool call failed; the message becomes the text of an ``isError`` tool result."""

    status = 400
    code = "tool_error"


_E = TypeVar("_E", bound=BaseException)


def find_error(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` itself or, depth first, the first exception of ``kind`` inside the (anyio task group)
    exception groups that wrap it; None when there is none."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_error(inner, kind)
            if found is not None:
                return found
    return None
