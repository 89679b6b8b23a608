"""The connector manager: every MCP server sidecar knows of, its trust state, and what the user does to it.

Sources (contract §5): packages in the repo's ``connectors/`` and ``<data>/connectors/``, the user's
``<config>/mcp.json``, plugins in ``<data>/plugins/``. Each is keyed ``<id>::<sha256>`` over its launch
config (and package files); trust lives in ``<state>/approvals.json``. Nothing untrusted is spawned or
listed, and a config whose hash changed since it was trusted is ``changed`` until trusted again.

The lifecycle's words (``ConnectorState``; contract §5, "the table of states"). A connector as a whole is:

- ``configured``: written in a config (a package, ``mcp.json``, a plugin), not trusted: nothing runs;
- ``trusted``: the user trusted it as it is now; a session's process starts on its first use;
- ``changed``: trusted once, but its config or files changed since: it needs trust again;
- ``error``: with the reason: it would not start when trusted (it stays so until trusted again).

Processes are per session, so ``connected`` and ``disconnected`` describe one session's use of a trusted
connector: ``connected`` while its process is up (initialized, its tools known), ``disconnected`` while
it has none (not started yet, ended, or crashed and restarting), ``error`` after a crash loop. Whether an
OAuth connector needs sign-in (``unauthorized``) is its sign-in state (``oauth.grant.SignIn``), shown
beside this one: a trusted connector stays ``trusted`` while it waits for a sign-in.
"""

from __future__ import annotations

import builtins
import enum
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.connectors.manifest.sources import ConnectorSpec, ManifestProblem, discover, load_package
from sidecar.connectors.manifest.trustkey import trust_key
from sidecar.errors import Conflict, NotFound, RequestRejected, SidecarError, ToolError
from sidecar.oauth.declared import Provider
from sidecar.store.files import ensure_private_dir
from sidecar.store.trust import TrustStore
from sidecar.text import preview

__all__ = ["Connector", "ConnectorManager", "ConnectorState"]

logger = logging.getLogger(__name__)


class ConnectorState(enum.StrEnum):
    """A connector's state (the first four), or a trusted connector's in one session (the last two and
    ``error``); see the module docstring."""

    CONFIGURED = "configured"
    TRUSTED = "trusted"
    CHANGED = "changed"
    ERROR = "error"
    DISCONNECTED = "disconnected"
    CONNECTED = "connected"


@dataclass(slots=True)
class Connector:
    spec: ConnectorSpec
    key: str
    state: ConnectorState
    error: str | None = None
    tool_drift: dict[str, str] = field(default_factory=dict)
    config_problem: str | None = None
    """Why its source is refused now; the last good config stays in force meanwhile."""

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def trusted(self) -> bool:
        return self.state is ConnectorState.TRUSTED

    def public(self, *, running: int = 0, connected: int = 0, detail: bool = False) -> dict[str, object]:
        """What the control API shows: ``state`` is the connector's own; ``connected`` counts the sessions
        that have it connected now, ``running`` its processes and relayed connections alive now."""
        launch = self.spec.launch
        body: dict[str, object] = {
            "id": self.id,
            "name": self.spec.name,
            "kind": self.spec.kind,
            "state": self.state.value,
            "connected_sessions": connected,
            "transport": launch.transport,
            "network": self.spec.network,
            "error": self.error,
            "config_problem": self.config_problem,
            "running": running,
        }
        if detail:
            body.update(
                {
                    "description": self.spec.description,
                    "version": self.spec.version,
                    "examples": list(self.spec.examples),
                    "origin": str(self.spec.origin),
                    "trust_key": self.key,
                    "command": [launch.command, *launch.args] if launch.command else None,
                    "env_keys": sorted(launch.env),
                    "cwd": launch.cwd,
                    "url": launch.url,
                    "tool_risks": dict(self.spec.tool_risks),
                    "oauth": self.spec.oauth is not None,
                    "oauth_client": launch.oauth.client_id if launch.oauth is not None else None,
                    "tool_drift": dict(self.tool_drift),
                }
            )
            if self.spec.oauth is not None:
                body.update(_provider(self.spec.oauth))
        return body


def _provider(provider: Provider) -> dict[str, object]:
    """A package's ``oauth-client.json`` as ``connectors show`` tells it: what the internal API may reach."""
    upstream = provider.upstream
    return {
        "oauth_client": provider.client_id or "(yours: connect --client-id)",
        "oauth_pkce": "S256" if provider.pkce else "none: the provider has no PKCE; the sign-in relies on state alone",
        "upstream": f"{upstream.base_url} {', '.join(upstream.methods)} {' '.join(upstream.paths)}",
    }


ChangeListener = Callable[[Connector, str], None]
"""Called with (connector, event): ``trusted``, ``untrusted``, ``changed`` (its trust key moved),
``restored`` (its key moved back to one the user trusted: an edit undone), or ``updated`` (still
trusted, but what it declares for sidecar changed: its tools' deferral)."""


class ConnectorManager:
    """Discovers connectors and keeps their trust state; ``refresh()`` re-reads every source."""

    def __init__(
        self,
        *,
        package_dirs: list[Path],
        user_config: Path,
        plugins_dir: Path,
        install_dir: Path,
        trust: TrustStore,
    ) -> None:
        self._package_dirs = package_dirs
        self._user_config = user_config
        self._plugins_dir = plugins_dir
        self._install_dir = install_dir
        self._trust = trust
        self._connectors: dict[str, Connector] = {}
        self.problems: list[ManifestProblem] = []
        self._listeners: list[ChangeListener] = []

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # -- reading -------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-read every source and recompute each connector's key and state.

        A connector whose config or package changed loses its trust (``changed``); one that is gone is
        withdrawn. A source that is refused now (a corrupt edit, a half-written file) keeps its last
        good connectors in force, each saying why in ``config_problem``: a bad edit loses nothing.
        """
        specs, problems = discover(
            package_dirs=self._package_dirs, user_config=self._user_config, plugins_dir=self._plugins_dir
        )
        previous = self._connectors
        fresh: dict[str, Connector] = {}
        events: list[tuple[Connector, str]] = []
        for spec in specs:
            try:
                key = trust_key(spec)
            except SidecarError as exc:
                problems.append(ManifestProblem(spec.origin, str(exc)))
                continue
            connector, event = self._reread(spec, key, previous.get(spec.id))
            fresh[spec.id] = connector
            if event is not None:
                events.append((connector, event))
        for gone in previous.keys() - fresh.keys():
            old = previous[gone]
            problem = _problem_of(old.spec, problems)
            if problem is not None:
                old.config_problem = problem.message
                fresh[gone] = old
            elif old.trusted:
                events.append((old, "changed"))
        for problem in problems:
            if problem not in self.problems:
                logger.warning("connector manifest refused: %s", problem)
        self._connectors = fresh
        self.problems = problems
        for connector, event in events:
            self._emit(connector, event)

    def _reread(self, spec: ConnectorSpec, key: str, old: Connector | None) -> tuple[Connector, str | None]:
        """The connector ``spec`` is now, and the event it makes: ``changed`` (its key moved since it was
        trusted), ``restored`` (its key moved back to a trusted one), ``updated`` (same key, trusted,
        another spec) or none."""
        state = self._state_for(spec.id, key)
        if old is None or old.key != key:
            connector = Connector(spec=spec, key=key, state=state)
            if old is not None and old.trusted:
                logger.warning("connector %s changed since it was trusted; it needs trust again", spec.id)
                return connector, "changed"
            if old is not None and connector.trusted:
                logger.info("connector %s is back to what was trusted; its route and tools return", spec.id)
                return connector, "restored"
            return connector, None
        if old.state is ConnectorState.ERROR and state is ConnectorState.TRUSTED:
            state = ConnectorState.ERROR  # it would not start: so it stays, with its reason, until trusted again
        if old.spec == spec:
            # Unchanged: the same object, so what others hold (its tool drift) stays current.
            old.state, old.config_problem = state, None
            return old, None
        connector = Connector(spec=spec, key=key, state=state, error=old.error, tool_drift=old.tool_drift)
        return connector, "updated" if connector.trusted else None

    def admit(self, spec: ConnectorSpec) -> None:
        """Refuse to start ``spec`` unless it is still exactly what the user trusted.

        Called before every spawn: it re-reads every source (a package file is re-hashed only where its
        ``stat`` changed), so an edit that no watcher reported is caught here, before its code runs.
        """
        self.refresh()
        connector = self._connectors.get(spec.id)
        if connector is None or not connector.trusted or connector.spec != spec:
            raise ToolError(
                f"connector {spec.id} changed since it was trusted; it will not start until the user "
                f"reviews it and runs: sidecar connectors trust {spec.id}"
            )

    def _state_for(self, connector_id: str, key: str) -> ConnectorState:
        if self._trust.is_trusted(key):
            return ConnectorState.TRUSTED
        if connector_id in self._trust.names():
            return ConnectorState.CHANGED
        return ConnectorState.CONFIGURED

    def list(self) -> list[Connector]:
        return sorted(self._connectors.values(), key=lambda c: c.id)

    def get(self, connector_id: str) -> Connector:
        connector = self._connectors.get(connector_id)
        if connector is None:
            raise NotFound(f"no connector {preview(connector_id, 64)} (see: sidecar connectors list)")
        return connector

    def trusted(self) -> builtins.list[Connector]:
        return [c for c in self.list() if c.trusted]

    # -- what the user does --------------------------------------------------------------------

    def trust(
        self, connector_id: str, *, facts: Callable[[ConnectorSpec], Mapping[str, object]] | None = None
    ) -> Connector:
        """Trust the connector's *current* config (and package files); a later edit needs trust again.
        ``facts`` of that config go into the audit record (how its process will run)."""
        self.refresh()  # SECURITY: trust what is on disk now, not what was read at start
        connector = self.get(connector_id)
        self._trust.trust(connector.key, name=connector.id, facts=facts(connector.spec) if facts else None)
        connector.state = ConnectorState.TRUSTED
        connector.tool_drift = {}
        self._emit(connector, "trusted")
        return connector

    def untrust(self, connector_id: str) -> Connector:
        connector = self.get(connector_id)
        self._trust.untrust(connector.id)
        was_trusted = connector.trusted
        connector.state, connector.error = ConnectorState.CONFIGURED, None
        if was_trusted:
            self._emit(connector, "untrusted")
        return connector

    def install(self, source: Path) -> Connector:
        """Validate a package directory and copy it to ``<data>/connectors/<id>``; it still needs trust."""
        source = source.expanduser().resolve()
        if not source.is_dir():
            raise RequestRejected(f"{source} is not a directory")
        spec = load_package(source)  # ConfigError names the file and field
        target = self._install_dir / spec.id
        if target.exists() or spec.id in self._connectors:
            raise Conflict(
                f"a connector named {spec.id!r} already exists ({target if target.exists() else 'configured'})"
            )
        ensure_private_dir(self._install_dir)
        staging = self._install_dir / f".{spec.id}.installing"
        if staging.exists():
            shutil.rmtree(staging)
        shutil.copytree(source, staging, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        staging.rename(target)
        self.refresh()
        return self.get(spec.id)

    def _emit(self, connector: Connector, event: str) -> None:
        for listener in self._listeners:
            try:
                listener(connector, event)
            except Exception:
                logger.exception("connector listener failed on %s", event)


def _problem_of(spec: ConnectorSpec, problems: builtins.list[ManifestProblem]) -> ManifestProblem | None:
    """The refusal of the file or package ``spec`` came from, if its source is refused now."""
    for problem in problems:
        if problem.path == spec.origin or (spec.root is not None and problem.path.is_relative_to(spec.root)):
            return problem
    return None
