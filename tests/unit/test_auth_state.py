"""Route tokens, sessions and the in-flight tracker, without HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.auth.inflight import InflightTracker
from sidecar.auth.routes import RouteRegistry, route_key
from sidecar.auth.sessions import SessionStore, session_key
from sidecar.errors import Conflict, EnvelopeRejected, NotFound, RequestRejected, Unauthorized


def test_route_token_is_43_chars_and_valid_only_while_registered() -> None:
    inflight = InflightTracker()
    routes = RouteRegistry(inflight)
    token = routes.register("connector-proxy", path="/mcp")
    assert len(token) == 43
    assert routes.authenticate("connector-proxy", token).name == "connector-proxy"
    with pytest.raises(Conflict):
        routes.register("connector-proxy", path="/mcp")
    aborted: list[str] = []
    with inflight.track([route_key("connector-proxy")], lambda: aborted.append("x")):
        routes.unregister("connector-proxy")
    assert aborted == ["x"]
    with pytest.raises(Unauthorized):
        routes.authenticate("connector-proxy", token)


@pytest.mark.parametrize("presented", [None, "", "x" * 43, "é" * 43, "Bearer abc"])
def test_wrong_tokens_are_unauthorized(presented: str | None) -> None:
    routes = RouteRegistry(InflightTracker())
    routes.register("r", path="/mcp")
    with pytest.raises(Unauthorized):
        routes.authenticate("r", presented)


def test_rotation_changes_generation_and_aborts() -> None:
    inflight = InflightTracker()
    routes = RouteRegistry(inflight)
    old = routes.register("r", path="/mcp")
    generation = routes.authenticate("r", old).generation
    hits: list[int] = []
    with inflight.track([route_key("r")], lambda: hits.append(1)):
        new = routes.rotate("r")
    assert hits == [1]
    assert routes.authenticate("r", new).generation != generation
    with pytest.raises(Unauthorized):
        routes.authenticate("r", old)
    with pytest.raises(NotFound):
        routes.rotate("nope")


def _store(inflight: InflightTracker, clock: list[float]) -> SessionStore:
    return SessionStore(inflight, default_ttl=3600, max_ttl=7200, clock=lambda: clock[0])


def test_session_envelope_works_until_end_or_expiry(tmp_path: Path) -> None:
    inflight, clock = InflightTracker(), [1_000_000.0]
    store = _store(inflight, clock)
    session, envelope = store.create(project_id="p", workspace=str(tmp_path))
    assert store.verify(envelope).id == session.id
    assert session.workspace == str(tmp_path.resolve())
    clock[0] += 3600
    with pytest.raises(EnvelopeRejected):
        store.verify(envelope)
    other, envelope2 = store.create(project_id="p", workspace=str(tmp_path))
    hits: list[int] = []
    with inflight.track([session_key(other.id)], lambda: hits.append(1)):
        store.end(other.id)
    assert hits == [1]
    with pytest.raises(EnvelopeRejected, match="unknown or ended"):
        store.verify(envelope2)


def test_envelope_of_another_store_is_rejected(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    _, envelope = _store(InflightTracker(), clock).create(project_id="p", workspace=str(tmp_path))
    with pytest.raises(EnvelopeRejected):
        _store(InflightTracker(), clock).verify(envelope)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "yolo"},
        {"allow": ["bad pattern"]},
        {"allow": ["mcp____*"]},
        {"ttl": 10},
        {"ttl": 10**9},
        {"project_id": ""},
        {"workspace": "/definitely/not/here"},
        {"label": "x" * 81},
        {"label": "two\nlines"},
        {"label": "bidi \u202e"},
    ],
)
def test_bad_session_requests_are_clear_errors(tmp_path: Path, kwargs: dict[str, object]) -> None:
    store = _store(InflightTracker(), [1_000_000.0])
    spec: dict[str, object] = {"project_id": "p", "workspace": str(tmp_path), **kwargs}
    with pytest.raises(RequestRejected):
        store.create(**spec)  # type: ignore[arg-type]
    assert store.list() == []


def test_workspace_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    with pytest.raises(RequestRejected, match="not a directory"):
        _store(InflightTracker(), [0.0]).create(project_id="p", workspace=str(file))


def test_a_session_knows_its_last_use_and_client_until_it_ends(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    store = _store(InflightTracker(), clock)
    session, envelope = store.create(project_id="p", workspace=str(tmp_path), label=" review bot ")
    shown = store.describe(session)
    assert (shown["label"], shown["client"], shown["last_used_at"]) == ("review bot", None, None)
    clock[0] += 90
    store.verify(envelope)
    store.note_client(session.id, {"name": "claude-code", "version": "2.1.0"})
    store.note_client(session.id, {"name": 7})  # not a clientInfo: ignored
    store.note_client("s_unknown", {"name": "x"})  # no such session: nothing kept
    shown = store.describe(store.get(session.id))
    assert (shown["client"], shown["last_used_at"]) == ("claude-code 2.1.0", 1_000_090)
    store.note_client(session.id, {"name": "n" * 500, "version": "1"})
    assert len(str(store.describe(session)["client"])) <= 80
    store.end(session.id)
    assert store.describe(session)["client"] is None  # its activity went with it
