"""The house rules that code can check: imports run one way, and only the edges import aiohttp.web."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sidecar"

# Layer of each module (lower may not import higher). STYLE.md: cli → daemon → app → {net, auth, bus,
# connectors, oauth, edge, control} → store → {config, paths, errors}, with one direction inside the
# middle: the bus (the tool pool and the one decision) knows nothing of connectors; connectors feed the
# bus through its registry; OAuth (grants, sign-in, the internal API's rule) knows nothing of connectors,
# which declare what it signs in to and ask it for each remote call's auth; the MCP edge (the SDK
# servers, the relay, the REST facade, the internal API) sits on all of them.
LAYERS = {
    "sidecar.errors": 0,
    "sidecar.paths": 0,
    "sidecar.names": 0,
    "sidecar.tuning": 0,
    "sidecar.system": 0,
    "sidecar.canonical": 0,
    "sidecar.text": 0,
    "sidecar.origins": 0,
    "sidecar.config": 1,
    "sidecar.validation": 1,
    "sidecar.store": 2,
    "sidecar.http": 3,
    "sidecar.net": 3,
    "sidecar.auth": 4,
    "sidecar.bus": 5,
    "sidecar.oauth": 6,
    "sidecar.connectors": 7,
    "sidecar.edge": 8,
    "sidecar.appkeys": 9,
    "sidecar.control": 10,
    "sidecar.console": 10,
    "sidecar.service": 10,
    "sidecar.app": 11,
    "sidecar.daemon": 12,
    "sidecar.cli": 13,
    "sidecar": 0,
    "sidecar.__main__": 14,
}


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    raise AssertionError(f"no layer for {module}")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [m for m in found if m == "sidecar" or m.startswith("sidecar.")]


def test_imports_run_one_way() -> None:
    problems = []
    for path in PACKAGE.rglob("*.py"):
        me = _module(path)
        for target in _imports(path):
            if target == "sidecar" and me != "sidecar":
                continue  # the version string
            if _layer(target) > _layer(me):
                problems.append(f"{me} (layer {_layer(me)}) imports {target} (layer {_layer(target)})")
    assert not problems, "\n".join(problems)


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


def test_pure_modules_import_no_web_framework() -> None:
    for pure in (
        "errors.py",
        "config.py",
        "net/hostcheck.py",
        "auth/envelope.py",
        "auth/sessions.py",
        "bus/policy.py",
        "bus/registry.py",
        "store/audit.py",
        "store/auditverify.py",
        "bus/shapes.py",
    ):
        assert "aiohttp" not in _all_imports(PACKAGE / pure), pure


def test_no_daemon_code_relies_on_an_assert() -> None:
    """The daemon runs with ``python -OO`` (``sidecar.tuning``), which strips every ``assert``."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert not found, "raise instead of asserting (stripped under -OO): " + ", ".join(found)
