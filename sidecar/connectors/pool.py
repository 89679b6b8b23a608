"""Per-session connector processes: spawned lazily, supervised, and stopped with their session (contract §7).

Each (session, connector) pair gets its own process, started on the first call that needs it with that
session's workspace and envelope in its placeholders, and an environment scrubbed down to a small
allowlist plus what the connector's ``mcp.json`` declares: no daemon secret, no route token, no user
token reaches it. Each process lives in a *holder* task that owns its async contexts (anyio scopes must
exit in the task that entered them); calls reach its ``ClientSession`` from any task.

Supervision: a process that exits on its own is a crash, recorded with the end of its stderr in the
``FailureLog`` (``sidecar connectors show``) and logged once at WARNING. Its session's tools of that
connector become unavailable (``on_change`` → ``tools/list_changed``); the pool restarts it after an
exponential backoff and the tools return once it answers again (another ``list_changed``). A crash loop
(``MAX_RESTARTS`` crashes within ``CRASH_WINDOW``) ends in ``error`` with the reason until the session
ends. Caps bound processes per connector and in total, and idle processes are reaped (a later call
spawns again).

Warm spares and shared processes, for a connector whose launch config has nothing per session in it
(``ConnectorSpec.session_free``): after a session takes a process of such a connector, the pool starts a
*spare* in the background (``PoolLimits.spares`` per connector, counted against the caps but never
taking the last free place, and stopped first when a session needs the place), and the next session's
first call takes it instead of a cold start. A spare is handed over only for exactly the spec it was
started for, after the same trust check as a spawn; stopping the connector (untrust, a config change)
stops its spares. A connector that says ``"process": "shared"`` (or every eligible one, with
``PoolLimits.share_all``) has one process for all sessions instead (``shared.SessionView``): supervised
and restarted like any, stopped with the connector or when idle, never with a session; ending a session
cancels only that session's calls in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, cast

from mcp import ClientSession

from sidecar.connectors.failures import FailureLog
from sidecar.connectors.launch import START_TIMEOUT, HttpAuthSource, LaunchPlan, http_transport
from sidecar.connectors.manifest.sources import ConnectorSpec
from sidecar.connectors.sharing.shared import SessionView
from sidecar.connectors.sharing.spares import Spares
from sidecar.connectors.stdio.lane import RawLane
from sidecar.connectors.stdio.process import ConnectorProcess, ProcessLimits
from sidecar.errors import SidecarError, ToolError, find_error
from sidecar.text import preview

__all__ = ["SHARED", "ConnectorPool", "PoolLimits"]

logger = logging.getLogger(__name__)

BACKOFF_START: Final = 0.5
BACKOFF_MAX: Final = 30.0
MAX_RESTARTS: Final = 5
CRASH_WINDOW: Final = 60.0
"""``MAX_RESTARTS`` crashes within this many seconds is a crash loop: the connector goes to ``error``."""
SHARED: Final = "(shared)"
"""The pool's session id for a shared process (never a real session's: those have no parentheses)."""


@dataclass(frozen=True, slots=True)
class PoolLimits:
    per_connector: int = 32
    total: int = 128
    idle_seconds: float = 900.0
    start_timeout: float = START_TIMEOUT
    per_session: int = 4
    """Relayed connections one session may hold of one connector (the pool keeps one per session)."""
    spares: int = 1
    """Warm spares kept per eligible connector (``ConnectorSpec.session_free``); 0: none."""
    share_all: bool = False
    """Every eligible connector is shared, as if it said ``"process": "shared"``."""


class _StartTimeout(Exception):
    """The connector did not answer ``initialize`` in time."""


@dataclass(slots=True)
class _Slot:
    """One (session, connector) pair: its live process, or why there is none."""

    process: ConnectorProcess | None = None
    client: ClientSession | SessionView | None = None
    """Its process's client; or, for a session of a shared connector, its view of the shared one."""
    holder: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)
    crashes: list[float] = field(default_factory=list)
    retry_at: float = 0.0
    error: str | None = None
    last_used: float = field(default_factory=time.monotonic)
    calls: int = 0
    spec: ConnectorSpec | None = None
    plan: Callable[[], LaunchPlan] | None = None
    restart: asyncio.Task[None] | None = None
    key: tuple[str, str] = ("", "")
    """Whose it is now: (session, connector); a spare's changes when a session takes it."""


@dataclass(frozen=True, slots=True)
class _Start:
    """What a holder starts: the connector, its plan for this process, and who waits for its session."""

    spec: ConnectorSpec
    plan: LaunchPlan
    ready: asyncio.Future[ClientSession]


ChangeCallback = Callable[[str, str], None]
"""(session id, connector id): the connector's availability in that session changed."""


class ConnectorPool:
    """All connector processes of all sessions."""

    def __init__(
        self,
        *,
        limits: PoolLimits | None = None,
        process_limits: ProcessLimits | None = None,
        on_change: ChangeCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[str | None], int] | None = None,
        admit: Callable[[ConnectorSpec], None] | None = None,
        failures: FailureLog | None = None,
        http_auth: HttpAuthSource | None = None,
        prepare: Callable[[ConnectorSpec, ClientSession], Awaitable[None]] | None = None,
    ) -> None:
        """``http_auth`` authenticates remote (Streamable HTTP) connectors.

        ``count`` counts processes against the caps when others than the pool's own run too (the relay's);
        ``admit`` raises ``ToolError`` unless a spec may start now (its trust still holds on disk);
        ``failures`` keeps each connector's last failed process (its reason and stderr) for ``connectors show``;
        ``prepare`` does, on a spare as it starts, what a session's first call would do first (the drift check)."""
        self._limits = limits or PoolLimits()
        self._failures = failures if failures is not None else FailureLog()
        self._process_limits = process_limits or ProcessLimits()
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._on_change = on_change
        self._clock = clock
        self._reaper: asyncio.Task[None] | None = None
        self._count = count or self.running
        self._admit = admit or (lambda spec: None)
        self._http_auth = http_auth
        self._prepare = prepare
        self._lanes: weakref.WeakKeyDictionary[ClientSession, RawLane] = weakref.WeakKeyDictionary()
        self.spares: Spares[_Slot] = Spares(
            self._limits.spares, count=self._count, limits=self._limits, start=self._start_spare
        )

    # -- facts ---------------------------------------------------------------------------------

    def running(self, connector_id: str | None = None) -> int:
        """Processes up now (spares and shared processes included; a session's view of a shared one is none)."""
        own = sum(
            1
            for (_, cid), slot in self._slots.items()
            if slot.client is not None
            and not isinstance(slot.client, SessionView)
            and (connector_id is None or cid == connector_id)
        )
        return own + self.spares.count(connector_id)

    def shares(self, spec: ConnectorSpec) -> bool:
        """Whether one process of ``spec`` serves every session."""
        return spec.process == "shared" or (self._limits.share_all and spec.session_free)

    def _live(self, slot: _Slot) -> bool:
        if isinstance(slot.client, SessionView):
            shared = self._slots.get((SHARED, slot.key[1]))
            return shared is not None and shared.client is slot.client.client
        return slot.client is not None

    def connected(self, connector_id: str) -> set[str]:
        """The sessions whose process of the connector (their own, or the shared one) is up now."""
        return {
            sid
            for (sid, cid), slot in self._slots.items()
            if cid == connector_id and sid != SHARED and self._live(slot)
        }

    def _serving(self, session_id: str, connector_id: str) -> _Slot | None:
        """The slot whose process serves that session: the shared one when there is one, else its own."""
        return self._slots.get((SHARED, connector_id)) or self._slots.get((session_id, connector_id))

    def available(self, session_id: str, connector_id: str) -> bool:
        """False while that session's process of the connector is crashed, backing off, or in error."""
        slot = self._serving(session_id, connector_id)
        if slot is None or slot.client is not None:
            return True
        return slot.error is None and not slot.crashes

    def error(self, session_id: str, connector_id: str) -> str | None:
        slot = self._serving(session_id, connector_id)
        return slot.error if slot is not None else None

    def lane(self, client: ClientSession | SessionView) -> RawLane | None:
        """The raw lane beside a stdio connector's client session (``lane.RawLane``); None for HTTP."""
        return self._lanes.get(client.client if isinstance(client, SessionView) else client)

    # -- getting a client ----------------------------------------------------------------------

    async def client(self, session_id: str, spec: ConnectorSpec, plan: Callable[[], LaunchPlan]) -> ClientSession:
        """The session's live client for ``spec``, spawning it if needed (bounded by the start timeout)."""
        if spec.launch.transport == "http" and self._http_auth is not None:
            self._http_auth.require(spec.id)  # a connector that needs a sign-in fails fast, with the remedy
        if session_id != SHARED and self.shares(spec):
            return await self._view(session_id, spec, plan)
        key = (session_id, spec.id)
        slot = self._slots.setdefault(key, _Slot(key=key))
        slot.last_used = self._clock()
        if slot.process is not None and slot.process.exited.is_set() and slot.holder is not None:
            # It died and its holder is winding down: let it record the crash before deciding.
            await asyncio.wait({slot.holder}, timeout=self._limits.start_timeout)
        if slot.client is not None:
            return _session(slot.client)
        async with slot.starting:
            if slot.client is not None:
                return _session(slot.client)
            if slot.error is not None:
                raise ToolError(f"connector {spec.id} is in error: {slot.error}")
            wait = slot.retry_at - self._clock()
            if wait > 0:
                raise ToolError(f"connector {spec.id} crashed and restarts in {wait:.0f}s; try again then")
            self._admit(spec)  # SECURITY: every spawn, restarts included, checks trust against the disk
            spare = self.spares.take(spec) if session_id != SHARED and spec.session_free else None
            if spare is not None and spare.client is not None:
                self._adopt(key, slot, spare, plan)
                self.spares.replenish(spec, plan)
                return _session(spare.client)
            await self.spares.make_room(spec.id)
            self.check_caps(spec.id)
            slot.spec, slot.plan = spec, plan
            client = await self._launch(slot, spec, plan)
            if session_id != SHARED and spec.session_free:
                self.spares.replenish(spec, plan)
            return client

    async def _launch(self, slot: _Slot, spec: ConnectorSpec, plan: Callable[[], LaunchPlan]) -> ClientSession:
        """Start ``slot``'s holder and wait (bounded) until its process has answered ``initialize``."""
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        slot.stop = asyncio.Event()
        start = _Start(spec, plan(), ready)
        holder = self._hold_http(slot, start) if start.plan.url is not None else self._hold(slot, start)
        slot.holder = asyncio.create_task(holder, name=f"connector-{spec.id}")
        self._ensure_reaper()
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self._limits.start_timeout + 5)
        except TimeoutError:
            slot.stop.set()
            raise ToolError(f"connector {spec.id} did not start within {self._limits.start_timeout:g}s") from None

    async def _start_spare(self, spec: ConnectorSpec, plan: Callable[[], LaunchPlan]) -> _Slot:
        """A new process of ``spec`` that no session has used (``Spares`` decides when and keeps it)."""
        self._admit(spec)  # SECURITY: a spare is a spawn like any other
        slot = _Slot(key=(Spares.SESSION, spec.id), spec=spec, plan=plan)
        try:
            client = await self._launch(slot, spec, plan)
            if self._prepare is not None:
                await self._prepare(spec, client)
        except BaseException:  # failed, or stopped while starting: nothing of it may outlive this
            slot.stop.set()
            if slot.holder is not None:
                await asyncio.wait({slot.holder})
            raise
        return slot

    def _adopt(self, key: tuple[str, str], slot: _Slot, spare: _Slot, plan: Callable[[], LaunchPlan]) -> None:
        """Make ``spare`` the session's slot; a caller already waiting on ``slot`` gets the same client."""
        spare.key, spare.plan, spare.last_used = key, plan, self._clock()
        spare.crashes, spare.retry_at = slot.crashes, slot.retry_at
        slot.client = spare.client
        self._slots[key] = spare

    async def _view(self, session_id: str, spec: ConnectorSpec, plan: Callable[[], LaunchPlan]) -> ClientSession:
        """The session's view of the connector's one shared process, started (or restarted) if need be."""
        client = await self.client(SHARED, spec, plan)
        if (shared := self._slots.get((SHARED, spec.id))) is not None:
            shared.plan = plan  # a restart expands it: the newest session's, the likeliest to be alive
        key = (session_id, spec.id)
        slot = self._slots.get(key)
        view = slot.client if slot is not None else None
        if not isinstance(view, SessionView) or view.client is not client:
            view = SessionView(session_id, client)
            slot = self._slots[key] = _Slot(key=key, client=view, spec=spec)
        if slot is not None:
            slot.last_used = self._clock()
        return _session(view)

    def check_caps(self, connector_id: str) -> None:
        """Refuse one more process of ``connector_id`` when its cap or the total cap is reached."""
        if self._count(connector_id) >= self._limits.per_connector:
            raise ToolError(f"connector {connector_id} already runs {self._limits.per_connector} processes")
        if self._count(None) >= self._limits.total:
            raise ToolError(f"sidecar already runs {self._limits.total} connector processes")

    async def _hold(self, slot: _Slot, start: _Start) -> None:
        """Own one process and its client session until stopped or crashed."""
        spec, plan, ready = start.spec, start.plan, start.ready
        process = ConnectorProcess(plan.argv, env=plan.env, cwd=plan.cwd, limits=self._process_limits, name=spec.id)
        slot.process = process
        crashed = False
        reason: str | None = None
        try:
            async with process, process.transport() as (read, write), ClientSession(read, write) as session:
                try:
                    await asyncio.wait_for(session.initialize(), self._limits.start_timeout)
                except TimeoutError:
                    raise _StartTimeout from None
                slot.client = session
                if process.lane is not None:
                    self._lanes[session] = process.lane
                ready.set_result(session)
                stop = asyncio.create_task(slot.stop.wait())
                exited = asyncio.create_task(process.exited.wait())
                await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
                crashed = not slot.stop.is_set()
                stop.cancel()
                exited.cancel()
                slot.client = None
        except Exception as exc:
            crashed = not slot.stop.is_set()
            if find_error(exc, _StartTimeout) is not None:
                reason = f"did not start: no answer to initialize within {self._limits.start_timeout:g}s"
            else:
                reason = process.exit_reason or preview(f"{type(exc).__name__}: {exc}", 200, quote=False)
            if not ready.done():
                ready.set_exception(ToolError(f"connector {spec.id} failed to start: {reason}"))
            if not (crashed or process.failed):  # a failure is logged once, with its stderr, just below
                logger.warning("connector %s (session %s) failed while stopping: %s", spec.id, slot.key[0], reason)
        finally:
            slot.client = None
            slot.process = None
            if plan.release is not None:
                plan.release()  # the process is gone: so is its internal-API credential
            if not ready.done():
                ready.set_exception(ToolError(f"connector {spec.id} stopped before it was ready"))
        self._held(spec, slot, process, crashed=crashed, reason=reason)

    def _held(
        self, spec: ConnectorSpec, slot: _Slot, process: ConnectorProcess, *, crashed: bool, reason: str | None
    ) -> None:
        """A process's hold ended: record a failure, replace a lost spare, or restart after a crash."""
        # The process has been stopped by now, so its stderr tail is complete.
        key = slot.key  # a spare's may have changed: the session that took it
        if crashed or process.failed:
            self._failures.record(
                spec.id, key[0], reason=reason or process.exit_reason or "exited", stderr=process.stderr_tail
            )
        if key[0] == Spares.SESSION:
            self.spares.lost(slot)  # no session lost anything; the next take starts another
        elif crashed:
            self._crashed(key, slot, process.exit_reason or "exited")

    async def _hold_http(self, slot: _Slot, start: _Start) -> None:
        """A Streamable HTTP connector: one MCP session per sidecar session, no process to supervise."""
        spec, plan, ready = start.spec, start.plan, start.ready
        auth = self._http_auth.auth_for(spec.id) if self._http_auth is not None else None
        try:
            async with http_transport(plan, auth=auth) as (read, write), ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), self._limits.start_timeout)
                slot.client = session
                ready.set_result(session)
                await slot.stop.wait()
        except Exception as exc:
            reason = preview(f"{type(exc).__name__}: {exc}", 200, quote=False)
            refused = find_error(exc, ToolError)  # the auth's own verdict (a sign-in is needed) is the reason
            if refused is not None:
                reason = str(refused)
            if not ready.done():
                ready.set_exception(refused or ToolError(f"connector {spec.id} is not reachable: {reason}"))
            logger.warning("connector %s (session %s) failed: %s", spec.id, slot.key[0], reason)
        finally:
            slot.client = None
            if not ready.done():
                ready.set_exception(ToolError(f"connector {spec.id} stopped before it was ready"))

    def _crashed(self, key: tuple[str, str], slot: _Slot, reason: str) -> None:
        now = self._clock()
        slot.crashes = [t for t in slot.crashes if now - t < CRASH_WINDOW] + [now]
        if len(slot.crashes) >= MAX_RESTARTS:
            slot.error = f"crashed {len(slot.crashes)} times in {CRASH_WINDOW:.0f}s; last: {reason}"
        else:
            backoff = min(BACKOFF_MAX, BACKOFF_START * 2 ** (len(slot.crashes) - 1))
            slot.retry_at = now + backoff
            slot.restart = asyncio.get_running_loop().create_task(self._restart(key, slot, backoff))
        if slot.error is not None:
            logger.warning("connector %s in session %s is in error: %s", key[1], key[0], slot.error)
        else:
            logger.info("connector %s in session %s restarts in %gs", key[1], key[0], slot.retry_at - now)
        self._changed(key)

    async def _restart(self, key: tuple[str, str], slot: _Slot, backoff: float) -> None:
        """Restart a crashed connector after its backoff; its tools return once it answers again."""
        await asyncio.sleep(backoff)
        if self._slots.get(key) is not slot or slot.spec is None or slot.plan is None:
            return  # the session ended or the connector was withdrawn meanwhile
        try:
            await self.client(key[0], slot.spec, slot.plan)
        except SidecarError as exc:  # ToolError, or a shared process's plan whose session has ended
            logger.info("restart of %s in session %s failed: %s", key[1], key[0], exc)
            return
        # Its tools return now; its crashes count on until a call succeeds (``healthy``): a server that
        # starts fine and crashes on every call still reaches the crash loop's error.
        self._changed(key)

    async def settle(self, session_id: str, connector_id: str) -> str | None:
        """After a lost connection: wait (bounded) for the holder to record the exit; return its reason."""
        slot = self._serving(session_id, connector_id)
        if slot is None or slot.holder is None:
            return None
        process = slot.process
        await asyncio.wait({slot.holder}, timeout=self._limits.start_timeout)
        return process.exit_reason if process is not None else None

    def healthy(self, session_id: str, connector_id: str) -> None:
        """A call succeeded: a crashed connector is back, its tools return."""
        slot = self._serving(session_id, connector_id)
        if slot is not None and slot.crashes:
            slot.crashes.clear()
            slot.retry_at = 0.0
            self._changed(slot.key)

    def _changed(self, key: tuple[str, str]) -> None:
        if self._on_change is None:
            return
        sessions = [key[0]]
        if key[0] == SHARED:  # the shared process serves every session that has a view of it
            sessions = [sid for (sid, cid) in self._slots if cid == key[1] and sid != SHARED]
        for session_id in sessions:
            try:
                self._on_change(session_id, key[1])
            except Exception:
                logger.exception("pool change listener failed")

    # -- stopping ------------------------------------------------------------------------------

    async def stop_session(self, session_id: str) -> None:
        await self._stop_where(lambda key: key[0] == session_id, forget=True)

    async def stop_connector(self, connector_id: str) -> None:
        """Stop its processes in every session, its shared process and its spares."""
        await asyncio.gather(
            self._stop_where(lambda key: key[1] == connector_id, forget=True), self.spares.stop(connector_id)
        )

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(self._stop_where(lambda key: True, forget=True), self.spares.stop(None))

    async def _stop_where(self, match: Callable[[tuple[str, str]], bool], *, forget: bool) -> None:
        keys = [key for key in self._slots if match(key)]
        holders = []
        for key in keys:
            slot = self._slots[key]
            if isinstance(slot.client, SessionView):
                slot.client.abort()  # that session's calls only; the shared process serves on
            slot.stop.set()
            if slot.restart is not None:
                slot.restart.cancel()
            if slot.holder is not None:
                holders.append(slot.holder)
            if forget:
                del self._slots[key]
        if holders:
            await asyncio.gather(*holders, return_exceptions=True)

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="connector-idle-reaper")

    async def _reap(self) -> None:
        interval = max(1.0, min(60.0, self._limits.idle_seconds / 4))
        while self._slots or self.spares.count(None):
            await asyncio.sleep(interval)
            now = self._clock()
            for slot in [*self._slots.values(), *self.spares.idle(now - self._limits.idle_seconds)]:
                if slot.client is not None and now - slot.last_used > self._limits.idle_seconds:
                    slot.stop.set()


def _session(client: ClientSession | SessionView) -> ClientSession:
    """A slot's client as callers use it: a session's view of a shared process offers the same methods."""
    return cast(ClientSession, client)
