"""The billing gate: does calling this tool cost money, so that a human must approve it (contract §6)?

A manifest ``high-credit-tools.json`` (``{"version": 1, "tools": {name: {"approvalKind", "group"}}}``)
marks the tools that cost money; a user's or plugin's ``mcp.json`` entry may instead declare them inline
(``"tools": {name: {"billable": {"approvalKind", "group"}}}``: a source with ``declared`` entries, part
of the entry's trust key, never re-read). Several manifests may cover one scope: ``builtin`` has the shipped one
and the user's; ``connector:<id>`` has its package's or plugin's own, which names the connector's tools
as the connector does (``prefix`` makes them the pool's ``mcp__<id>__<tool>``). A tool is billable when
any of them lists it; a scope that no manifest covers is free.

The gate fails closed. A required manifest that is missing, any manifest that is unreadable, unsafe
(``StorageError``: a symlink, someone else's file, group/world-writable), not JSON, or not the schema —
or any exception inside the gate — makes every tool of that scope billable with kind ``unverifiable``
and no group (so the approval is never remembered). Unlike the trust store, a broken manifest does not
fall back to its last good copy: a broken billing manifest asks.

``check()`` runs on every tool call, so each manifest is ``lstat``-ed at most once per
``recheck_seconds`` and re-read only when its identity changes. The gate is synchronous and meant for one
event loop; it holds no lock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from sidecar.errors import StorageError
from sidecar.names import TOOL_NAME, connector_of_route
from sidecar.store.files import loads_strict, read_private
from sidecar.validation import render_errors

__all__ = [
    "MANIFEST_NAME",
    "UNVERIFIABLE",
    "BillableTool",
    "BillingGate",
    "GateVerdict",
    "ManifestSource",
    "load_manifest",
    "read_source",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME: Final = "high-credit-tools.json"
UNVERIFIABLE: Final = "unverifiable"
"""The ``kind`` of a verdict the gate could not verify: approval is required and never remembered."""

_MAX_MANIFEST_BYTES: Final = 1024 * 1024  # a manifest is a short list; anything bigger is a mistake

_ToolName = Annotated[str, StringConstraints(pattern=f"^{TOOL_NAME.pattern}$")]


class BillableTool(BaseModel):
    """One manifest entry: a tool that costs money."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    approval_kind: str = Field(alias="approvalKind", min_length=1, max_length=64)
    """What the approval prompt calls this cost (``image-generation``, ``video``...)."""
    group: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    """Approvals may be remembered for the session per group: allowing ``images`` does not allow ``video``."""


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: int
    tools: dict[_ToolName, BillableTool]

    @field_validator("version")
    @classmethod
    def _version_one(cls, value: int) -> int:
        # Strict int already refuses true and 1.0 (``Literal[1]`` accepts both).
        if value != 1:
            raise ValueError(f"unsupported version {value}; this sidecar reads version 1")
        return value


@dataclass(frozen=True, slots=True)
class GateVerdict:
    """What the gate says about one tool call; ``billable`` means a human must approve it."""

    billable: bool
    kind: str | None
    """``approvalKind`` from the manifest, or ``unverifiable`` when the gate failed."""
    group: str | None
    """Remember-group; ``None`` when the gate failed (such approvals are never remembered)."""
    reason: str
    """``free``, ``listed in <file>``, or what went wrong (file and field); never a secret."""

    FREE: ClassVar[GateVerdict]

    @property
    def verifiable(self) -> bool:
        return self.kind != UNVERIFIABLE


GateVerdict.FREE = GateVerdict(billable=False, kind=None, group=None, reason="free")


def _closed(reason: str) -> GateVerdict:
    # SECURITY: the fail-closed verdict: ask, and never remember the answer.
    return GateVerdict(billable=True, kind=UNVERIFIABLE, group=None, reason=reason)


@dataclass(frozen=True, slots=True)
class ManifestSource:
    scope: str
    """Which tools it covers: ``builtin``, or ``connector:<id>`` (a package's or a plugin's server)."""
    path: Path
    required: bool
    """Required: missing fails the whole scope closed. Optional: missing means no entries."""
    prefix: str = ""
    """What makes the manifest's names the pool's: ``mcp__<id>__`` for a connector's, none for built-ins."""
    declared: tuple[tuple[str, BillableTool], ...] | None = None
    """Entries declared in a config entry instead of a file (``path`` names that config); never read."""


class _Unexpected(Exception):
    """Wraps a bug met while loading, so the caller can log its traceback."""


def load_manifest(path: Path) -> dict[str, BillableTool]:
    """Read and validate one manifest; return its tools by name.

    ``FileNotFoundError`` passes through (the caller knows whether the file is required); everything
    else that is wrong raises ``StorageError`` naming the file and, for schema errors, the field.
    """
    raw = read_private(path, max_bytes=_MAX_MANIFEST_BYTES)  # SECURITY: no symlinks, ours, not writable by others
    try:
        data = loads_strict(raw)
    except (ValueError, RecursionError) as exc:
        raise StorageError(f"{path}: not valid JSON ({exc})") from exc
    try:
        manifest = _Manifest.model_validate(data)
    except ValidationError as exc:
        raise StorageError(render_errors(exc, source=str(path))) from exc
    return dict(manifest.tools)


_StatKey = tuple[int, int, int, int, int, int, int]
_MISSING: Final[_StatKey] = (-1, -1, -1, -1, -1, -1, -1)


def _stat_key(path: Path) -> _StatKey:
    """The file's identity: re-read when any of it changes.

    Besides (mtime_ns, size, inode) it holds ctime, mode and owner: fixing a world-writable manifest with
    ``chmod`` changes neither mtime nor size nor inode, and must still take effect.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return _MISSING
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode, info.st_uid)


@dataclass(slots=True)
class _SourceState:
    source: ManifestSource
    checked_at: float | None = None
    key: _StatKey | None = None
    """Identity of the file last loaded; ``None`` forces a re-read at the next check."""
    tools: Mapping[str, BillableTool] = field(default_factory=dict)
    problem: str | None = None


class BillingGate:
    """Billable or free, per (scope, tool), from a set of manifests; fails closed."""

    def __init__(
        self,
        sources: Sequence[ManifestSource],
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_seconds: float = 1.0,
    ) -> None:
        self._clock = clock
        self._recheck = recheck_seconds
        self._states: list[_SourceState] = []
        self._internal_error: str | None = None
        self._logged_internal: set[str] = set()
        for source in sources:
            self.add_source(source)

    def add_source(self, source: ManifestSource) -> None:
        """Cover ``source.scope`` with one more manifest (read at the next check of that scope)."""
        if any(state.source == source for state in self._states):
            return
        self._states.append(_SourceState(source))

    def cover(self, scope: str, sources: Sequence[ManifestSource]) -> None:
        """Make ``sources`` the manifests of ``scope``, in place of any it had (a connector trusted again,
        withdrawn, or moved): a manifest that no longer applies must not make its old scope ask."""
        if any(source.scope != scope for source in sources):
            raise ValueError(f"every source must cover {scope!r}")
        kept = {state.source: state for state in self._states if state.source.scope == scope}
        self._states = [state for state in self._states if state.source.scope != scope]
        for source in dict.fromkeys(sources):
            self._states.append(kept.get(source) or _SourceState(source))

    def check(self, *, scope: str, tool: str) -> GateVerdict:
        """The verdict for one call. Never raises: any failure is the fail-closed verdict."""
        try:
            verdict = self._check(scope, tool)
        except Exception as exc:  # SECURITY: the gate's boundary; a bug must ask, not allow
            name = type(exc).__name__
            self._internal_error = f"billing gate failed internally ({name}); see the daemon log"
            if name not in self._logged_internal:
                self._logged_internal.add(name)
                logger.warning("billing gate failed checking %s/%s; asking for approval", scope, tool, exc_info=True)
            return _closed(self._internal_error)
        self._internal_error = None
        return verdict

    def problems(self) -> list[str]:
        """Current manifest problems (one line each, naming the file), for ``sidecar status``."""
        found: list[str] = []
        for state in self._states:
            try:
                self._refresh(state)
            except Exception:
                logger.warning("billing gate failed refreshing %s", state.source.path, exc_info=True)
                found.append(f"{state.source.path}: could not be checked; see the daemon log")
                continue
            if state.problem is not None:
                found.append(state.problem)
        if self._internal_error is not None:
            found.append(self._internal_error)
        return found

    def _check(self, scope: str, tool: str) -> GateVerdict:
        states = [state for state in self._states if state.source.scope == scope]
        for state in states:
            self._refresh(state)
        broken = [state.problem for state in states if state.problem is not None]
        if broken:
            return _closed("; ".join(broken))
        for state in states:
            prefix = state.source.prefix
            entry = state.tools.get(tool[len(prefix) :]) if tool.startswith(prefix) else None
            if entry is not None:
                # With several manifests listing one tool, the first source added decides kind and group.
                return GateVerdict(
                    billable=True,
                    kind=entry.approval_kind,
                    group=_scoped_group(scope, entry.group),
                    reason=f"listed in {state.source.path}",
                )
        return GateVerdict.FREE

    def _refresh(self, state: _SourceState) -> None:
        now = self._clock()
        if state.checked_at is not None and now - state.checked_at < self._recheck:
            return
        source = state.source
        if source.declared is not None:
            self._settle(state, now, None, dict(source.declared), None)
            return
        try:
            key: _StatKey | None = _stat_key(source.path)
        except OSError as exc:
            self._settle(state, now, None, {}, f"{source.path}: cannot stat ({exc.strerror})")
            return
        if key is not None and key == state.key:
            state.checked_at = now
            return
        try:
            tools, problem = self._load(source, missing=key == _MISSING)
        except _Unexpected as exc:
            cause = exc.__cause__
            problem = f"{source.path}: could not be checked ({type(cause).__name__}); see the daemon log"
            self._settle(state, now, None, {}, problem, cause)
            return
        self._settle(state, now, key, tools, problem)

    @staticmethod
    def _load(source: ManifestSource, *, missing: bool) -> tuple[Mapping[str, BillableTool], str | None]:
        if missing:
            return {}, (f"{source.path}: required billing manifest is missing" if source.required else None)
        try:
            return load_manifest(source.path), None
        except FileNotFoundError:  # removed between lstat and open
            return {}, (f"{source.path}: required billing manifest is missing" if source.required else None)
        except StorageError as exc:
            return {}, str(exc)
        except OSError as exc:
            return {}, f"{source.path}: cannot read ({exc.strerror})"
        except Exception as exc:
            raise _Unexpected from exc

    @staticmethod
    def _settle(
        state: _SourceState,
        now: float,
        key: _StatKey | None,
        tools: Mapping[str, BillableTool],
        problem: str | None,
        cause: BaseException | None = None,
    ) -> None:
        """Publish one source's new state at once, logging when its problem changes (not per call)."""
        if problem != state.problem:
            if problem is not None:
                exc_info = (type(cause), cause, cause.__traceback__) if cause is not None else None
                logger.warning(
                    "billing manifest problem, asking before every %s tool call: %s",
                    state.source.scope,
                    problem,
                    exc_info=exc_info,
                )
            elif state.checked_at is not None:
                logger.info("billing manifest %s is valid again", state.source.path)
        # An unexpected failure keeps key None, so the file is read again at the next check.
        state.key = key if cause is None else None
        state.tools = tools
        state.problem = problem
        state.checked_at = now


def read_source(source: ManifestSource) -> tuple[Mapping[str, BillableTool], str | None]:
    """One manifest read now, as the gate would read it: its tools by the manifest's own names, and its
    problem (``None`` when sound). What ``connectors show`` reports, trusted or not; never raises."""
    if source.declared is not None:
        return dict(source.declared), None
    missing = not os.path.lexists(source.path)
    try:
        return BillingGate._load(source, missing=missing)
    except _Unexpected as exc:
        logger.warning("billing manifest %s could not be checked", source.path, exc_info=exc.__cause__)
        return {}, f"{source.path}: could not be checked ({type(exc.__cause__).__name__}); see the daemon log"


def _scoped_group(scope: str, group: str) -> str:
    """A manifest's group as the session remembers it: a connector's groups are its own (``<id>/<group>``),
    so approving one connector's ``images`` for a session never approves another connector's ``images``."""
    connector = connector_of_route(scope)
    return group if connector is None else f"{connector}/{group}"
