"""Benchmark: the tool pool at 1 000 registered tools — ``tools/list``, ``tool_search`` and the decision.

``--tools N`` generates N tools instead (the growth table in docs/benchmarks.md runs 10, 1 000 and 10 000).

A seeded ``ToolRegistry`` of 1 000 realistic tools (``github_create_issue``-style names, 20-40 word
descriptions from a fixed vocabulary, 3-6 parameters, mostly LOW/MEDIUM and a few HIGH) is wired
through the real composition root (``build_app``: built-ins, billable gate, ``ToolService``,
``build_mcp_server``), and these are timed **in process** (server time, no HTTP):

* ``tools/list``: the SDK server's registered ``tools/list`` handler (``ToolService.listed`` + one
  ``types.Tool`` per tool) with ``auto_defer_above`` above the pool, so every tool is listed; then the
  SDK's wire shaping of that result (``model_dump`` + the per-version surface sieve + JSON encoding).
* ``tool_search``: ``ToolService.search`` for a handful of 2-4 word queries with every tool deferred,
  and the whole ``tool_search`` built-in run through ``ToolService.call`` (decision, argument checks,
  formatting, audit append).
* the decision: ``decide()`` alone and ``ToolService.decide_call`` (registry lookup + billable gate +
  ``decide``) per call, in ns.

Then end to end: the daemon in this process (``tests/conftest.running_daemon``) with the same pool,
``tools/list`` over real HTTP with aiohttp in both protocol eras (2025-11-25 handshake + SSE answer;
2026-07-28 single POST) — client time included, so these rows have no target.

Figures are the median wall time over runs, with the p95 and the median CPU time of this process
(``time.process_time``): on a shared machine the CPU figure is the steadier one. PASS/MISS compares
the median wall time with the target. A target that misses triggers a cProfile of that path (top
functions by own time, on stderr); ``--profile`` always does.

    scripts/bench_pool.py            # ~1 min
    scripts/bench_pool.py --quick    # ~30 s smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import functools
import gc
import importlib
import io
import itertools
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.conftest (running_daemon)

import aiohttp  # noqa: E402
import benchlib  # noqa: E402  (scripts/ is sys.path[0])
from mcp import types  # noqa: E402
from mcp.server.context import ServerRequestContext  # noqa: E402
from mcp_types import JSONRPCResponse  # noqa: E402
from mcp_types import methods as sdk_methods  # noqa: E402

from sidecar.appkeys import REGISTRY, SESSIONS, TOOLS, Runtime  # noqa: E402
from sidecar.auth.encoding import mint_token, token_digest  # noqa: E402
from sidecar.auth.principal import SCOPE_KEY, Principal  # noqa: E402
from sidecar.auth.sessions import Session, SessionStore  # noqa: E402
from sidecar.bus.policy import FREE, Phase, decide  # noqa: E402
from sidecar.bus.registry import CallContext, Risk, ToolOutput, ToolRegistry  # noqa: E402
from sidecar.bus.tools import ToolService  # noqa: E402
from sidecar.config import Settings, ToolSettings  # noqa: E402
from sidecar.edge.mcp import ChangeHub, _tool_to_mcp, build_mcp_server  # noqa: E402
from sidecar.names import PROXY_ROUTE  # noqa: E402
from sidecar.paths import Paths  # noqa: E402
from sidecar.store.files import ensure_private_dir  # noqa: E402

N_TOOLS = 1000
LIST_TARGET_MS = 5.0
SEARCH_TARGET_MS = 2.0
LEGACY_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"
LISTED_ALL = 5000  # auto_defer_above for the listing runs: above the pool, so nothing is deferred
DEFER_ALL = 64  # the default: a pool of 1 000 defers everything but the meta-tools

SERVICES = (
    "github",
    "gitlab",
    "jira",
    "linear",
    "slack",
    "notion",
    "gdrive",
    "gmail",
    "calendar",
    "stripe",
    "sentry",
    "datadog",
    "postgres",
    "s3",
    "kubernetes",
    "figma",
    "zendesk",
    "hubspot",
    "confluence",
    "pagerduty",
    "twilio",
    "salesforce",
    "airtable",
    "asana",
    "dropbox",
)
VERBS = {  # verb -> risk (delete is sometimes HIGH, see _risk)
    "get": Risk.LOW,
    "list": Risk.LOW,
    "search": Risk.LOW,
    "export": Risk.LOW,
    "count": Risk.LOW,
    "create": Risk.MEDIUM,
    "update": Risk.MEDIUM,
    "add": Risk.MEDIUM,
    "archive": Risk.MEDIUM,
    "delete": Risk.MEDIUM,
}
NOUNS = (
    "issue",
    "pull_request",
    "comment",
    "file",
    "folder",
    "message",
    "channel",
    "user",
    "team",
    "project",
    "ticket",
    "invoice",
    "payment",
    "customer",
    "event",
    "alert",
    "dashboard",
    "record",
    "table",
    "page",
    "label",
    "release",
    "deployment",
    "webhook",
    "report",
)
FILLER = (
    "returns",
    "result",
    "results",
    "matching",
    "given",
    "identifier",
    "optional",
    "filter",
    "filters",
    "sorted",
    "newest",
    "oldest",
    "first",
    "page",
    "pages",
    "cursor",
    "pagination",
    "workspace",
    "organization",
    "account",
    "owner",
    "repository",
    "branch",
    "status",
    "state",
    "open",
    "closed",
    "draft",
    "pending",
    "resolved",
    "priority",
    "assignee",
    "reviewer",
    "author",
    "title",
    "body",
    "markdown",
    "text",
    "plain",
    "html",
    "attachment",
    "attachments",
    "metadata",
    "fields",
    "field",
    "custom",
    "default",
    "value",
    "values",
    "limit",
    "maximum",
    "minimum",
    "count",
    "total",
    "summary",
    "details",
    "full",
    "partial",
    "recent",
    "updated",
    "created",
    "timestamp",
    "date",
    "range",
    "since",
    "until",
    "timezone",
    "utc",
    "json",
    "csv",
    "format",
    "export",
    "import",
    "sync",
    "synced",
    "remote",
    "local",
    "cache",
    "cached",
    "fresh",
    "api",
    "token",
    "scope",
    "permission",
    "permissions",
    "access",
    "read",
    "write",
    "admin",
    "member",
    "members",
    "group",
    "groups",
    "role",
    "roles",
    "email",
    "address",
    "phone",
    "name",
    "names",
    "description",
    "tags",
    "tag",
    "labels",
    "category",
    "categories",
    "link",
    "links",
    "url",
    "urls",
    "preview",
    "thumbnail",
    "size",
    "bytes",
    "version",
    "versions",
    "history",
    "audit",
    "log",
    "logs",
    "error",
    "errors",
    "warning",
    "retry",
    "retries",
    "timeout",
    "rate",
    "limited",
    "quota",
    "usage",
    "billing",
    "amount",
    "currency",
    "tax",
    "discount",
    "refund",
    "charge",
    "subscription",
    "plan",
    "trial",
    "region",
    "zone",
    "cluster",
    "namespace",
    "pod",
    "service",
    "query",
    "queries",
    "index",
    "schema",
    "column",
    "columns",
    "row",
    "rows",
    "snapshot",
    "backup",
    "restore",
    "notify",
    "notification",
    "notifications",
    "mention",
    "mentions",
    "thread",
    "threads",
    "reply",
    "reaction",
    "emoji",
    "calendar",
    "meeting",
    "attendee",
    "invite",
    "reminder",
    "deadline",
    "milestone",
    "sprint",
    "board",
    "column",
    "workflow",
    "automation",
    "trigger",
    "action",
    "actions",
    "run",
    "runs",
    "job",
    "jobs",
    "pipeline",
    "build",
    "test",
    "tests",
    "coverage",
    "artifact",
    "artifacts",
    "secret",
)
CONNECTIVES = ("the", "a", "of", "for", "with", "and", "in", "to", "by", "or", "from", "when", "if", "only")
PARAMETERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("owner", {"type": "string"}),
    ("repo", {"type": "string"}),
    ("id", {"type": "string", "minLength": 1}),
    ("title", {"type": "string", "maxLength": 256}),
    ("body", {"type": "string"}),
    ("labels", {"type": "array", "items": {"type": "string"}}),
    ("assignee", {"type": "string"}),
    ("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}),
    ("cursor", {"type": "string"}),
    ("state", {"type": "string", "enum": ["open", "closed", "all"]}),
    ("query", {"type": "string", "maxLength": 500}),
    ("channel", {"type": "string"}),
    ("text", {"type": "string"}),
    ("due_date", {"type": "string", "format": "date"}),
    ("priority", {"type": "string", "enum": ["low", "medium", "high", "urgent"]}),
    ("include_archived", {"type": "boolean", "default": False}),
    ("sort", {"type": "string", "enum": ["created", "updated", "name"]}),
    ("fields", {"type": "array", "items": {"type": "string"}}),
    ("amount", {"type": "integer", "minimum": 0}),
    ("currency", {"type": "string", "pattern": "^[A-Z]{3}$"}),
    ("email", {"type": "string", "format": "email"}),
    ("path", {"type": "string"}),
    ("recursive", {"type": "boolean"}),
    ("timeout_seconds", {"type": "number", "minimum": 0}),
)
QUERIES = (
    "create github issue",
    "list open pull requests",
    "send slack message",
    "refund stripe payment",
    "search jira tickets assignee",
    "upload file to drive",
    "pagerduty alert",
    "export sentry errors csv",
)


log = functools.partial(benchlib.log, tag="bench-pool")


# --------------------------------------------------------------------------------------------------
# The pool
# --------------------------------------------------------------------------------------------------


async def _handler(arguments: dict[str, Any], call: CallContext) -> ToolOutput:
    return ToolOutput(text="ok", structured={"received": sorted(arguments)})


def _sentence(rng: random.Random, words: int) -> str:
    picked = [rng.choice(CONNECTIVES) if rng.random() < 0.25 else rng.choice(FILLER) for _ in range(words)]
    return " ".join(picked).capitalize() + "."


def _risk(rng: random.Random, verb: str) -> Risk:
    if verb == "delete" and rng.random() < 0.3:
        return Risk.HIGH
    return VERBS[verb]


def build_pool(seed: int, n: int = N_TOOLS) -> ToolRegistry:
    """``n`` distinct seeded tools; the same seed always gives the same registry."""
    rng = random.Random(seed)
    combos = [(s, v, o) for s in SERVICES for v in VERBS for o in NOUNS]
    registry = ToolRegistry()
    picks = [(combo, "") for combo in rng.sample(combos, min(n, len(combos)))]
    while len(picks) < n:  # more tools than names: the same names again, versioned (_v2, _v3, ...)
        suffix = f"_v{len(picks) // len(combos) + 1}"
        picks += [(combo, suffix) for combo in rng.sample(combos, min(n - len(picks), len(combos)))]
    for (service, verb, noun), suffix in picks:
        name = f"{service}_{verb}_{noun}{suffix}"
        target = rng.randint(20, 40)
        lead = f"{verb.capitalize()} a {noun.replace('_', ' ')} in {service.capitalize()}."
        parts = [lead]
        count = len(lead.split())
        while count < target:
            words = min(target - count, rng.randint(5, 12))
            parts.append(_sentence(rng, words))
            count += words
        properties: dict[str, Any] = {}
        for pname, schema in rng.sample(PARAMETERS, rng.randint(3, 6)):
            properties[pname] = {**schema, "description": _sentence(rng, rng.randint(4, 9))}
        required = rng.sample(sorted(properties), rng.randint(1, 2))
        registry.add(
            name=name,
            description=" ".join(parts),
            risk=_risk(rng, verb),
            handler=_handler,
            parameters={"type": "object", "properties": properties, "required": required},
            title=f"{service.capitalize()}: {verb} {noun.replace('_', ' ')}",
            needs_network=rng.random() < 0.5,
        )
    return registry


@dataclass
class Wired:
    """One in-process composition: the app's ToolService and session store, a session and its SDK server."""

    tools: ToolService
    sessions: SessionStore
    registry: ToolRegistry
    session: Session
    server: Any


@contextlib.asynccontextmanager
async def wired(seed: int, auto_defer_above: int, home: Path, workspace: Path) -> AsyncIterator[Wired]:
    """``build_app`` over a fresh seeded pool, started without a socket, as the daemon wires it."""
    from aiohttp import web

    from sidecar.app import build_app

    paths = Paths.resolve({"SIDECAR_HOME": str(home)})
    for directory in (paths.config, paths.state, paths.data):
        ensure_private_dir(directory)
    token = mint_token()
    settings = Settings(tools=ToolSettings(auto_defer_above=auto_defer_above))
    pool = build_pool(seed, N_TOOLS)
    runner = web.AppRunner(build_app(settings, paths, Runtime(token, token_digest(token)), registry=pool))
    await runner.setup()  # runs the app's subsystems (cleanup_ctx); no site, so no socket
    app = runner.app
    try:
        sessions = app[SESSIONS]
        session, _ = sessions.create(project_id="bench", workspace=str(workspace), mode="default", allow=("*",))
        server = build_mcp_server(tools=app[TOOLS], sessions=sessions, hub=ChangeHub())
        yield Wired(app[TOOLS], sessions, app[REGISTRY], session, server)
    finally:
        await runner.cleanup()


def _list_context(session: Session, version: str) -> ServerRequestContext[Any, Any]:
    """What the SDK hands ``on_list_tools``: only ``request.scope`` (the principal) is read."""
    principal = Principal(route=PROXY_ROUTE, generation=1, session_id=session.id)  # /mcp, the tool pool's route
    request = SimpleNamespace(scope={SCOPE_KEY: principal})
    return ServerRequestContext(
        session=cast(Any, None), lifespan_context={}, protocol_version=version, method="tools/list", request=request
    )


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


@dataclass
class Samples:
    """Per-run wall times and this process's CPU times, in ms (ns for the per-decision rows)."""

    values: list[float]
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def p95(self) -> float:
        ordered = sorted(self.values)
        return ordered[int(0.95 * (len(ordered) - 1))]

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None


def time_sync(fn: Callable[[], object], runs: int, warmup: int) -> Samples:
    for _ in range(warmup):
        fn()
    gc.collect()
    wall: list[float] = []
    cpu: list[float] = []
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    for _ in range(runs):
        c0, w0 = cpu_clock(), clock()
        fn()
        w1, c1 = clock(), cpu_clock()
        wall.append((w1 - w0) / 1e6)
        cpu.append((c1 - c0) / 1e6)
    return Samples(wall, cpu)


async def time_async(fn: Callable[[], Awaitable[object]], runs: int, warmup: int) -> Samples:
    for _ in range(warmup):
        await fn()
    gc.collect()
    wall: list[float] = []
    cpu: list[float] = []
    clock, cpu_clock = time.perf_counter_ns, time.process_time_ns
    for _ in range(runs):
        c0, w0 = cpu_clock(), clock()
        await fn()
        w1, c1 = clock(), cpu_clock()
        wall.append((w1 - w0) / 1e6)
        cpu.append((c1 - c0) / 1e6)
    return Samples(wall, cpu)


def per_call_ns(batch: Callable[[int], object], total: int, batches: int = 100) -> Samples:
    """ns per operation: ``total`` operations in ``batches`` timed batches, net of the empty loop."""
    size = max(1, total // batches)

    def empty(n: int) -> None:
        for _ in itertools.repeat(None, n):
            pass

    def run(fn: Callable[[int], object]) -> list[float]:
        fn(size)
        out = []
        for _ in range(batches):
            start = time.perf_counter_ns()
            fn(size)
            out.append((time.perf_counter_ns() - start) / size)
        return out

    baseline = statistics.median(run(empty))
    return Samples([v - baseline for v in run(batch)])


def _report(label: str, profiler: cProfile.Profile, runs: int, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return f"--- cProfile: {label} ({runs} runs, by own time) ---\n{out.getvalue()}"


def profile(label: str, fn: Callable[[], object], runs: int, top: int = 20) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        fn()
    profiler.disable()
    return _report(label, profiler, runs, top)


async def profile_async(label: str, fn: Callable[[], Awaitable[object]], runs: int, top: int = 20) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        await fn()
    profiler.disable()
    return _report(label, profiler, runs, top)


def run_coroutine_sync(factory: Callable[[], Awaitable[object]]) -> Callable[[], object]:
    """A handler coroutine that never suspends, driven to completion without an event loop hop."""

    def step() -> object:
        coro = cast(Any, factory())
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise RuntimeError("the handler suspended; time it with time_async instead")

    return step


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    value: str
    target: str = ""
    verdict: str = ""


@dataclass
class Plan:
    runs: int
    warmup: int
    decisions: int
    http_runs: int


QUICK = Plan(runs=60, warmup=10, decisions=20_000, http_runs=20)
FULL = Plan(runs=200, warmup=30, decisions=100_000, http_runs=100)


def _ms(s: Samples) -> str:
    cpu = s.cpu_median
    return f"{s.median:.2f} ms (p95 {s.p95:.2f}" + (f", cpu {cpu:.2f})" if cpu is not None else ")")


def _ns(s: Samples) -> str:
    return f"{s.median:.0f} ns (p95 {s.p95:.0f})"


def _verdict(s: Samples, limit: float) -> str:
    return "PASS" if s.median < limit else "MISS"


def _wire(answer: types.ListToolsResult, version: str) -> int:
    """Roughly what the SDK does with the handler's result before the bytes leave (returns their size).

    ``ServerRunner._serialize``: ``model_dump`` then the per-version surface sieve (validate + dump);
    then the transport: 2025-era ``JSONRPCResponse.model_dump_json``, 2026-07-28 ``model_dump`` +
    ``json.dumps``. The SDK's dispatcher does a little more between the two (not counted here).
    """
    dumped = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
    sieved = sdk_methods.serialize_server_result("tools/list", version, dumped)
    message = JSONRPCResponse(jsonrpc="2.0", id=1, result=sieved)
    if version == LEGACY_VERSION:
        return len(message.model_dump_json(by_alias=True, exclude_unset=True))
    return len(json.dumps(message.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")))


def bench_list(w: Wired, plan: Plan, rows: list[Row], profiles: list[str], force: bool) -> None:
    entry = w.server.get_request_handler("tools/list")
    assert entry is not None
    ctx = _list_context(w.session, LEGACY_VERSION)
    handler = run_coroutine_sync(lambda: entry.handler(ctx, None))
    result = cast(types.ListToolsResult, handler())
    listed = len(result.tools)
    high = sum(1 for t in w.registry if t.risk is Risk.HIGH)
    if listed != len(w.registry) - high:
        raise RuntimeError(f"expected every non-HIGH tool listed, got {listed} of {len(w.registry)}")

    full = time_sync(handler, plan.runs, plan.warmup)
    rows.append(
        Row(
            f"tools/list handler: listed() + {listed} types.Tool",
            _ms(full),
            f"< {LIST_TARGET_MS:g} ms",
            _verdict(full, LIST_TARGET_MS),
        )
    )
    rows.append(
        Row(
            "  of which ToolService.listed()", _ms(time_sync(lambda: w.tools.listed(w.session), plan.runs, plan.warmup))
        )
    )
    pool = w.tools.listed(w.session)
    rows.append(
        Row(
            f"  of which _tool_to_mcp x {len(pool)}",
            _ms(time_sync(lambda: [_tool_to_mcp(t) for t in pool], plan.runs, plan.warmup)),
        )
    )
    size = _wire(result, LEGACY_VERSION)
    wire_runs = max(10, plan.runs // 4)
    for version in (LEGACY_VERSION, MODERN_VERSION):
        alone = time_sync(lambda v=version: _wire(result, v), wire_runs, 3)  # type: ignore[misc]
        rows.append(Row(f"  + SDK serialization after the handler, {version}", _ms(alone), "info"))
    rows.append(Row("tools/list response body", f"{size / 1024:.0f} KiB, {listed} tools"))
    if force or full.median >= LIST_TARGET_MS:
        profiles.append(profile("tools/list handler (on_list_tools)", handler, 30))
        profiles.append(
            profile("SDK serialization of that result, 2025-11-25", lambda: _wire(result, LEGACY_VERSION), 10)
        )


async def bench_search(w: Wired, plan: Plan, rows: list[Row], profiles: list[str], force: bool) -> None:
    meta = {"tool_search", "tool_call", "list_connectors"}
    if any(t.name not in meta for t in w.tools.listed(w.session)):
        raise RuntimeError("expected every tool but the meta-tools deferred")
    session = w.session
    start = time.perf_counter_ns()
    w.tools.search(session, QUERIES[0], 10)
    first = (time.perf_counter_ns() - start) / 1e6
    rows.append(Row("tool_search: first search (builds the BM25 index)", f"{first:.1f} ms", "info"))
    every: list[float] = []
    every_cpu: list[float] = []
    per_query: list[tuple[str, Samples, int]] = []
    for query in QUERIES:
        samples = time_sync(lambda q=query: w.tools.search(session, q, 10), plan.runs, plan.warmup)  # type: ignore[misc]
        per_query.append((query, samples, len(w.tools.search(session, query, 10))))
        every.extend(samples.values)
        every_cpu.extend(samples.cpu)
    overall = Samples(every, every_cpu)
    rows.append(
        Row(
            f"tool_search: ToolService.search, {len(QUERIES)} queries, limit 10",
            _ms(overall),
            f"< {SEARCH_TARGET_MS:g} ms",
            _verdict(overall, SEARCH_TARGET_MS),
        )
    )
    for query, samples, hits in per_query:
        rows.append(Row(f"  {query!r} ({hits} hits)", _ms(samples)))
    rows.append(
        Row(
            "  of which visible() (the pool size: 1 decide per tool)",
            _ms(time_sync(lambda: w.tools.visible(session), plan.runs, plan.warmup)),
        )
    )
    rows.append(
        Row(
            "  of which SearchIndex.search, no filter",
            _ms(
                time_sync(
                    lambda: [w.tools._index.search(q, limit=10) for q in QUERIES], max(10, plan.runs // len(QUERIES)), 3
                )
            ),
            "(all queries)",
        )
    )

    async def builtin() -> None:
        outcome = await w.tools.call(session, "tool_search", {"query": QUERIES[0]}, via="bench")
        if outcome.is_error:
            raise RuntimeError(f"tool_search failed: {outcome.text}")

    whole = await time_async(builtin, plan.runs, plan.warmup)
    rows.append(
        Row(
            "tool_search built-in via ToolService.call (+audit)",
            _ms(whole),
            f"< {SEARCH_TARGET_MS:g} ms",
            _verdict(whole, SEARCH_TARGET_MS),
        )
    )
    if force or overall.median >= SEARCH_TARGET_MS:
        profiles.append(
            profile(
                "ToolService.search (each query once per run)",
                lambda: [w.tools.search(session, q, 10) for q in QUERIES],
                20,
            )
        )
    if force or whole.median >= SEARCH_TARGET_MS:
        profiles.append(await profile_async("tool_search via ToolService.call", builtin, 200))


def bench_decide(w: Wired, plan: Plan, rows: list[Row]) -> None:
    tools = [t for t in w.registry if t.risk is not Risk.HIGH]
    names = [t.name for t in tools]
    session = w.session
    narrow = Session(
        id=session.id,
        project_id=session.project_id,
        workspace=session.workspace,
        mode=session.mode,
        allow=(*(f"other_tool_{i}" for i in range(31)), names[-1]),
        network=True,
        created_at=session.created_at,
        expires_at=session.expires_at,
    )

    def decisions(who: Session, phase: Phase) -> Callable[[int], object]:
        cycle = itertools.cycle(tools)

        def batch(n: int) -> None:
            for tool in itertools.islice(cycle, n):
                decide(who, tool, phase, FREE)

        return batch

    def decide_calls(n: int) -> None:
        for name in itertools.islice(cycle_names, n):
            w.tools.decide_call(session, name)

    cycle_names = itertools.cycle(names)
    for label, batch in (
        ("decide() per call, CALL phase, grant '*'", decisions(session, Phase.CALL)),
        ("decide() per call, LIST phase, grant '*'", decisions(session, Phase.LIST)),
        ("decide() per call, CALL phase, 32-name grant (no *)", decisions(narrow, Phase.CALL)),
        ("ToolService.decide_call per call (lookup+billing+decide)", decide_calls),
    ):
        rows.append(Row(label, _ns(per_call_ns(batch, plan.decisions)), "info"))


async def bench_http(seed: int, plan: Plan, home: Path, workspace: Path, rows: list[Row]) -> None:
    # tests/conftest.py is the one way tests start an in-process daemon; imported by name so that mypy does
    # not follow it into the test-only stub gaps (psutil).
    running_daemon = importlib.import_module("tests.conftest").running_daemon

    # Shipped defaults first: above 64 tools a session's pool is deferred, so tools/list is the meta-tools;
    # then every tool listed, the worst case the target speaks of.
    for label, settings in (
        ("shipped defaults, auto-defer", Settings()),
        (f"all {N_TOOLS} listed", Settings(tools=ToolSettings(auto_defer_above=LISTED_ALL))),
    ):
        paths = Paths.resolve({"SIDECAR_HOME": str(home / label.split()[0])})
        async with running_daemon(paths, workspace, settings, registry=build_pool(seed)) as daemon:
            session = await daemon.new_session(project="bench")
            base = {
                **session["headers"],
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
            }
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as http:
                for era in ("legacy", "modern"):
                    lister = await _open_lister(http, session["url"], base, era)
                    samples = await time_async(lister, plan.http_runs, max(5, plan.warmup // 3))
                    version = LEGACY_VERSION if era == "legacy" else MODERN_VERSION
                    how = "initialize once, SSE" if era == "legacy" else "single POST, JSON"
                    rows.append(Row(f"HTTP tools/list {version} ({how}), {label}", _ms(samples), "info (client incl.)"))


async def _open_lister(
    http: aiohttp.ClientSession, url: str, base: dict[str, str], era: str
) -> Callable[[], Awaitable[None]]:
    headers = dict(base)
    ids = itertools.count(1)
    if era == "legacy":
        init = {
            "jsonrpc": "2.0",
            "id": next(ids),
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "bench-pool", "version": "1"},
            },
        }
        async with http.post(url, data=json.dumps(init), headers=headers) as response:
            await response.read()
            if response.status != 200 or not response.headers.get("mcp-session-id"):
                raise RuntimeError(f"initialize answered {response.status}")
            headers["Mcp-Session-Id"] = response.headers["mcp-session-id"]
        headers["MCP-Protocol-Version"] = LEGACY_VERSION
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        async with http.post(url, data=note, headers=headers) as response:
            await response.read()
    else:
        headers["MCP-Protocol-Version"] = MODERN_VERSION
        headers["Mcp-Method"] = "tools/list"

    async def tools_list() -> None:
        request_id = next(ids)
        params: dict[str, Any] = {}
        if era != "legacy":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientInfo": {"name": "bench-pool", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params})
        async with http.post(url, data=body, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"tools/list answered {response.status}: {raw[:200]!r}")
            message = benchlib.answer(response.headers.get("content-type", ""), raw, request_id)
            count = len(message.get("result", {}).get("tools", []))
            if count < 1:
                raise RuntimeError(f"tools/list returned {count} tools: {json.dumps(message)[:200]}")

    return tools_list


# --------------------------------------------------------------------------------------------------


def render(rows: list[Row], header: str) -> str:
    table = [("metric", "value", "target", "")] + [(r.label, r.value, r.target, r.verdict) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = [header]
    for i, row in enumerate(table):
        lines.append(" | ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    misses = [r.label.strip() for r in rows if r.verdict == "MISS"]
    lines.append("")
    lines.append("ALL TARGETS MET" if not misses else f"MISSED: {'; '.join(misses)}")
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    if args.runs:
        plan = dataclasses.replace(plan, runs=args.runs)
    started = time.monotonic()
    rows: list[Row] = []
    profiles: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sidecar-bench-pool-") as tmp:
        workdir = Path(tmp)
        workspace = workdir / "workspace"
        workspace.mkdir()
        log(f"building a {N_TOOLS}-tool pool (seed {args.seed})")
        async with wired(args.seed, LISTED_ALL, workdir / "home-list", workspace) as w:
            counts = {risk: sum(1 for t in w.registry if t.risk is risk) for risk in Risk}
            header = (
                f"tool pool: {len(w.registry)} tools ({N_TOOLS} generated + built-ins; "
                + ", ".join(f"{r.value} {n}" for r, n in counts.items())
                + f"), python {sys.version.split()[0]}, {'quick' if args.quick else 'full'} run: "
                f"{plan.runs} runs per figure, {plan.decisions} decisions, {plan.http_runs} HTTP requests"
            )
            log("tools/list in process")
            bench_list(w, plan, rows, profiles, args.profile)
            log("decisions")
            bench_decide(w, plan, rows)
        # A pool smaller than the default threshold would defer nothing, leaving tool_search nothing to find.
        defer_above = DEFER_ALL if N_TOOLS > DEFER_ALL else 1
        async with wired(args.seed, defer_above, workdir / "home-search", workspace) as w:
            log("tool_search in process")
            await bench_search(w, plan, rows, profiles, args.profile)
        if not args.no_http:
            log("tools/list over HTTP (daemon in process)")
            await bench_http(args.seed, plan, workdir / "home-http", workspace, rows)
    print(render(rows, header), flush=True)
    for text in profiles:
        print(text, file=sys.stderr, flush=True)
    log(f"done in {time.monotonic() - started:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    global N_TOOLS, LISTED_ALL
    parser = argparse.ArgumentParser(
        prog="scripts/bench_pool.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--runs", type=int, help="timed runs per in-process figure (default 200, quick 60)")
    parser.add_argument("--seed", type=int, default=1000, help="seed of the generated pool")
    parser.add_argument("--tools", type=int, default=N_TOOLS, help=f"tools generated (default {N_TOOLS})")
    parser.add_argument("--no-http", action="store_true", help="skip the end-to-end HTTP rows")
    parser.add_argument("--profile", action="store_true", help="cProfile every timed path, not only misses")
    args = parser.parse_args(argv)
    N_TOOLS, LISTED_ALL = args.tools, min(10_000, max(LISTED_ALL, args.tools + 100))  # the setting allows 10 000
    os.environ.pop("SIDECAR_HOME", None)  # every home here is a temporary directory
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
