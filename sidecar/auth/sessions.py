"""Sidecar sessions: what an agent host may do, held by the daemon and named by a signed envelope.

The envelope (``X-Sidecar-Context``) only names the session and binds project, workspace, mode and
lifetime; permissions always come from the ``Session`` record here (contract §4). Ending a session aborts
its in-flight work and its envelope stops working at once.

Sessions outlive a daemon restart until they expire (issue 14 item 5): every change is handed to a
``SessionJournal`` (``auth.persist``), which keeps the records on disk and the envelope key in the
credential store, and a restarted daemon is built with what it kept (``restored``, ``keys``). Nothing
here touches disk itself. Without a journal (unit tests) sessions live in memory only.

What a person recognises a session by: its ``label`` (given at creation: the host it was made for, or
the command ``sidecar exec`` ran), and its ``Activity`` — the client that last initialized on it (name
and version from ``clientInfo``) and when it was last used. Activity is kept in memory only: a busy
client would otherwise cost a write per request; after a restart it is empty until the next use.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from sidecar.auth.encoding import b64url_encode
from sidecar.auth.envelope import EnvelopeKeys, SessionClaims
from sidecar.auth.inflight import InflightTracker
from sidecar.auth.owners import Owner
from sidecar.errors import EnvelopeRejected, NotFound, RequestRejected
from sidecar.names import BUILTIN_GRANT, is_grant_pattern
from sidecar.text import preview

__all__ = ["Activity", "Mode", "Session", "SessionJournal", "SessionStore", "session_key", "validate_pattern"]

logger = logging.getLogger(__name__)


class Mode(enum.StrEnum):
    """How much a session may do without asking (contract §6)."""

    DEFAULT = "default"
    READ_ONLY = "read-only"
    BYPASS = "bypass"


_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")
MAX_LABEL = 80
"""Characters of a session's label; control characters are refused."""
MAX_CLIENT = 80
"""Characters of a client's "name version" kept; longer is cut."""
MAX_PATTERNS = 256
VERIFIED_CACHE = 4096
"""Envelopes whose MAC was verified, remembered so a busy client costs one HMAC, not one per request."""


def validate_pattern(pattern: str) -> str:
    """Allowed forms: an exact tool name, ``builtin:*``, ``mcp__<server>__*``, or ``*`` (contract §2)."""
    if is_grant_pattern(pattern):
        return pattern
    raise RequestRejected(
        f"invalid tool pattern {preview(pattern, 80)}: use a tool name, {BUILTIN_GRANT}, mcp__<server>__* or *"
    )


def session_key(session_id: str) -> tuple[str, str]:
    """The in-flight key for everything running on behalf of a session."""
    return ("session", session_id)


@dataclass(frozen=True, slots=True)
class Session:
    """One session's record. Immutable: a grant change replaces the record."""

    id: str
    project_id: str
    workspace: str
    mode: Mode
    allow: tuple[str, ...]
    network: bool
    created_at: int
    expires_at: int
    owner: Owner | None = None
    """The process this session ends with (``sidecar exec``), or None: it lives until ended or expired."""
    agent: Owner | None = None
    """A second process it ends with: the agent ``sidecar exec`` runs, which could stop its exec."""
    label: str = ""
    """What a person calls it (``--label``; by default the host format or the command exec ran)."""

    def expired(self, now: float) -> bool:
        return now >= self.expires_at

    def public(self) -> dict[str, object]:
        """What ``session list`` and the control API show (never the envelope)."""
        return {
            "session_id": self.id,
            "project_id": self.project_id,
            "workspace": self.workspace,
            "mode": self.mode.value,
            "allow": list(self.allow),
            "network": self.network,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "owner_pid": self.owner.pid if self.owner is not None else None,
            "agent_pid": self.agent.pid if self.agent is not None else None,
            "label": self.label,
        }

    def owners(self) -> tuple[Owner, ...]:
        """The processes this session ends with, as soon as any one of them is gone."""
        return tuple(owner for owner in (self.owner, self.agent) if owner is not None)


@dataclass(slots=True)
class Activity:
    """How a session has been used since this daemon started (never written to disk)."""

    last_used_at: int | None = None
    client: str | None = None
    """The name and version the last client to initialize on it gave (``clientInfo``)."""

    def public(self) -> dict[str, object]:
        return {"last_used_at": self.last_used_at, "client": self.client}


def _check_label(label: str) -> str:
    if len(label) > MAX_LABEL or not label.isprintable():
        raise RequestRejected(f"label must be at most {MAX_LABEL} printable characters on one line")
    return label.strip()


class SessionJournal(Protocol):
    """Where sessions are kept across restarts (``auth.persist.StateJournal``)."""

    def sessions_changed(self, sessions: Iterable[Session]) -> None: ...


SessionListener = Callable[[Session, str], None]
"""Called with (session, event) where event is ``created``, ``updated``, ``ended``, or ``closed`` (the
daemon stops: the session leaves this process but lives on for the next one)."""


def _span(seconds: int) -> str:
    """``2592000`` → ``30 days``: a bound as a person reads it."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} seconds"


def canonical_workspace(path: str) -> str:
    """The real path of an existing directory; anything else is a clear 400."""
    try:
        real = Path(path).expanduser().resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise RequestRejected(f"workspace {preview(path, 200)} does not exist") from exc
    if not real.is_dir():
        raise RequestRejected(f"workspace {preview(path, 200)} is not a directory")
    return str(real)


class SessionStore:
    """Create, look up, change and end sessions; verify envelopes against live records."""

    def __init__(
        self,
        inflight: InflightTracker,
        *,
        keys: EnvelopeKeys | None = None,
        key_source: Callable[[], EnvelopeKeys] | None = None,
        journal: SessionJournal | None = None,
        restored: Iterable[Session] = (),
        default_ttl: int,
        max_ttl: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``keys`` sign and verify envelopes; without them, ``key_source`` gives them when the first
        session is made (``prepare``), or else a fresh key is made now. ``restored``: the sessions of an
        earlier run, as the journal kept them (their envelopes verify with ``keys``)."""
        self._sessions: dict[str, Session] = {s.id: s for s in restored}
        if keys is None and key_source is None:
            keys = EnvelopeKeys.generate()
        self._keys = keys
        self._key_source = key_source
        self._journal = journal
        self._inflight = inflight
        self._default_ttl = default_ttl
        self._max_ttl = max_ttl
        self._clock = clock
        self._listeners: list[SessionListener] = []
        self._verified: OrderedDict[str, SessionClaims] = OrderedDict()
        self._activity: dict[str, Activity] = {}

    def subscribe(self, listener: SessionListener) -> None:
        self._listeners.append(listener)

    async def prepare(self) -> None:
        """Have the signing key at hand before ``create``: the first time, it comes from the credential
        store (the OS keyring, perhaps), so it is fetched off the event loop."""
        if self._keys is None and self._key_source is not None:
            keys = await asyncio.to_thread(self._key_source)
            if self._keys is None:
                self._keys = keys

    def _signing_keys(self) -> EnvelopeKeys:
        if self._keys is None:
            if self._key_source is None:  # unreachable: __init__ leaves one or the other
                raise RuntimeError("no envelope keys")
            self._keys = self._key_source()  # a caller that skipped prepare(): on the loop, once
        return self._keys

    def owned(self) -> list[tuple[str, Owner]]:
        """(session id, owner) for each process a live session ends with (a session may name two)."""
        return [(s.id, owner) for s in self._sessions.values() for owner in s.owners()]

    def create(
        self,
        *,
        project_id: str,
        workspace: str,
        mode: str = Mode.DEFAULT.value,
        allow: Iterable[str] = (BUILTIN_GRANT,),
        network: bool = True,
        ttl: int | None = None,
        owner: Owner | None = None,
        label: str = "",
    ) -> tuple[Session, str]:
        """Create a session and return it with its envelope. Unless ``allow`` says otherwise, it may use
        the built-ins and no connector tool (contract §2: a connector needs an explicit grant).
        ``owner``: the process it ends with."""
        if not _PROJECT.fullmatch(project_id):
            raise RequestRejected("project must be 1-128 characters of letters, digits and ._:/@-")
        ttl = self._default_ttl if ttl is None else ttl
        if not 60 <= ttl <= self._max_ttl:
            raise RequestRejected(
                f"ttl must be between 60 seconds and {_span(self._max_ttl)} ([sessions] max_ttl in sidecar.toml)"
            )
        patterns = self._patterns(allow)
        now = int(self._clock())
        session = Session(
            id="s_" + b64url_encode(secrets.token_bytes(16)),
            project_id=project_id,
            workspace=canonical_workspace(workspace),
            mode=self._mode(mode),
            allow=patterns,
            network=network,
            created_at=now,
            expires_at=now + ttl,
            owner=owner,
            label=_check_label(label),
        )
        keys = self._signing_keys()
        self._prune(now)
        self._sessions[session.id] = session
        self._save()
        envelope = keys.sign(
            SessionClaims(
                session_id=session.id,
                project_id=session.project_id,
                workspace=session.workspace,
                mode=session.mode.value,
                iat=now,
                exp=session.expires_at,
            )
        )
        self._emit(session, "created")
        return session, envelope

    def envelope(self, session_id: str) -> str:
        """A fresh envelope for a live session (what its connector processes get as their context)."""
        session = self.get(session_id)
        return self._signing_keys().sign(
            SessionClaims(
                session_id=session.id,
                project_id=session.project_id,
                workspace=session.workspace,
                mode=session.mode.value,
                iat=session.created_at,
                exp=session.expires_at,
            )
        )

    def verify(self, envelope: str | None) -> Session:
        """The live session an envelope names; ``EnvelopeRejected`` (403) for anything else."""
        if envelope is None:
            raise EnvelopeRejected("missing X-Sidecar-Context")
        now = self._clock()
        claims = self._verified.get(envelope)
        if claims is None:
            if self._keys is None:  # no session was ever made with these keys: none can verify
                raise EnvelopeRejected("unknown or ended session")
            claims = self._keys.verify(envelope, now=int(now))
            # A MAC verdict depends only on the exact string and our keys, so remember it (bounded);
            # expiry and the session's liveness are still checked on every request below.
            self._verified[envelope] = claims
            if len(self._verified) > VERIFIED_CACHE:
                self._verified.popitem(last=False)
        session = self._sessions.get(claims.session_id)
        if session is None:
            raise EnvelopeRejected("unknown or ended session")
        if session.expired(now):
            raise EnvelopeRejected("session expired")
        # SECURITY: the envelope binds these; a record that no longer matches is not this session.
        if (claims.project_id, claims.workspace, claims.iat) != (
            session.project_id,
            session.workspace,
            session.created_at,
        ):
            raise EnvelopeRejected("envelope does not match the session")
        self.activity(session.id).last_used_at = int(now)
        return session

    def activity(self, session_id: str) -> Activity:
        """The session's activity record (made on first use; dropped when the session ends)."""
        found = self._activity.get(session_id)
        if found is None:
            found = self._activity[session_id] = Activity()
        return found

    def note_client(self, session_id: str, info: object) -> None:
        """A client initialized on the session: keep its ``clientInfo`` name and version (bounded)."""
        if not isinstance(info, dict) or session_id not in self._sessions:
            return
        name, version = info.get("name"), info.get("version")
        if not isinstance(name, str) or not name:
            return
        text = f"{name} {version}" if isinstance(version, str) and version else name
        self.activity(session_id).client = preview(text, MAX_CLIENT, quote=False)

    def describe(self, session: Session) -> dict[str, object]:
        """``Session.public`` with how it has been used (``session list``, the console, ``status``)."""
        found = self._activity.get(session.id)
        return {**session.public(), **(found.public() if found is not None else Activity().public())}

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or session.expired(self._clock()):
            raise NotFound(f"no session {preview(session_id, 64)}")
        return session

    def alive(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is None or session.expired(self._clock()):
            return None
        return session

    def list(self) -> list[Session]:
        self._prune(self._clock())
        return sorted(self._sessions.values(), key=lambda s: s.created_at)

    def update(
        self,
        session_id: str,
        *,
        mode: str | None = None,
        allow: Iterable[str] | None = None,
        network: bool | None = None,
    ) -> Session:
        """Change a session's grant; it applies to the next call (and listeners send list_changed)."""
        session = self.get(session_id)
        if mode is None and allow is None and network is None:
            return session  # nothing asked to change: no write, no list_changed
        changed = replace(
            session,
            mode=self._mode(mode) if mode is not None else session.mode,
            allow=self._patterns(allow) if allow is not None else session.allow,
            network=network if network is not None else session.network,
        )
        self._sessions[session_id] = changed
        self._save()
        self._emit(changed, "updated")
        return changed

    def name_agent(self, session_id: str, agent: Owner) -> Session:
        """Make the session end with ``agent`` too (``sidecar exec``'s agent); once per session.

        Only ever shortens a session's life, so it changes no grant and tells no listener."""
        session = self.get(session_id)
        if session.agent is not None:
            raise RequestRejected(f"session {session_id} already ends with process {session.agent.pid}")
        changed = self._sessions[session_id] = replace(session, agent=agent)
        self._save()
        return changed

    def end(self, session_id: str) -> int:
        """End a session: its envelope dies now and its in-flight work is aborted."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise NotFound(f"no session {preview(session_id, 64)}")
        self._activity.pop(session_id, None)
        aborted = self._inflight.abort(session_key(session_id))
        self._save()  # SECURITY: an ended session must stay ended after a restart
        self._emit(session, "ended")
        return aborted

    def close_all(self) -> None:
        """The daemon stops: every session leaves this process (its in-flight work aborted, listeners
        told ``closed``) without being ended — the journal, closed first, keeps it for the next start."""
        for session in list(self._sessions.values()):
            del self._sessions[session.id]
            self._inflight.abort(session_key(session.id))
            self._emit(session, "closed")

    def _prune(self, now: float) -> None:
        expired = [s for s in self._sessions.values() if s.expired(now)]
        for session in expired:
            self._sessions.pop(session.id, None)
            self._activity.pop(session.id, None)
            self._inflight.abort(session_key(session.id))
        if expired:
            self._save()
        for session in expired:
            self._emit(session, "ended")

    def _save(self) -> None:
        if self._journal is not None:
            self._journal.sessions_changed(self._sessions.values())

    @staticmethod
    def _mode(mode: str) -> Mode:
        try:
            return Mode(mode)
        except ValueError:
            raise RequestRejected(f"mode must be one of {', '.join(m.value for m in Mode)}") from None

    @staticmethod
    def _patterns(allow: Iterable[str]) -> tuple[str, ...]:
        patterns = tuple(dict.fromkeys(validate_pattern(p) for p in allow))
        if len(patterns) > MAX_PATTERNS:
            raise RequestRejected(f"at most {MAX_PATTERNS} tool patterns")
        return patterns

    def _emit(self, session: Session, event: str) -> None:
        for listener in self._listeners:
            try:
                listener(session, event)
            except Exception:
                logger.exception("session listener failed on %s", event)
