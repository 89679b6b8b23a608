"""The house rules that code can check: imports run one way, only the edges import aiohttp.web, and a
dependency's private names are reached only in ``sidecar/seams``."""

from __future__ import annotations

import ast
import importlib
import inspect
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
    "sidecar.seams": 0,
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
    "sidecar.auditing": 10,
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


def test_the_design_pages_layer_line_is_the_one_enforced() -> None:
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    block = text.split("```", 2)[1]
    line = " ".join(block.split())
    written = [{name.strip() for name in group.strip(" {}").split(",")} for group in line.split("→")]
    by_layer: dict[int, set[str]] = {}
    for module, layer in LAYERS.items():
        if module.count(".") == 1:
            by_layer.setdefault(layer, set()).add(module.removeprefix("sidecar."))
    by_layer.pop(14, None)  # __main__, only the entry point
    assert written == [by_layer[layer] for layer in sorted(by_layer, reverse=True)]


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


MAX_MODULE_LINES = 500
"""A module longer than this does more than one thing a reader can hold at once: split it."""


def test_every_module_is_at_most_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


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


# --- private names of dependencies ---------------------------------------------------------------------

SEAMS = PACKAGE / "seams"


def _outside_seams() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if SEAMS not in path.parents]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _our_private_names() -> set[str]:
    """Every private name sidecar itself defines: functions, classes, attributes, module and class names."""
    ours: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                ours.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                ours.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                ours.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value):
                ours.add(node.value)  # __slots__ entries, dataclass field names given as text
    return {name for name in ours if _private(name)}


def test_a_dependencys_private_names_are_reached_only_in_the_seams() -> None:
    ours = _our_private_names()
    problems = []
    for path in _outside_seams():
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] == "sidecar":
                    continue
                if any(_private(part) for part in node.module.split(".")):
                    problems.append(f"{where}:{node.lineno} imports the private module {node.module}")
                problems.extend(
                    f"{where}:{node.lineno} imports {node.module}.{alias.name}"
                    for alias in node.names
                    if _private(alias.name)
                )
            elif isinstance(node, ast.Import):
                problems.extend(
                    f"{where}:{node.lineno} imports the private module {alias.name}"
                    for alias in node.names
                    if any(_private(part) for part in alias.name.split("."))
                )
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
                problems.append(f"{where}:{node.lineno} reaches {ast.unparse(node)}, which sidecar does not define")
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "setattr", "hasattr"):
                named = node.args[1] if len(node.args) > 1 else None
                text = named.value if isinstance(named, ast.Constant) and isinstance(named.value, str) else ""
                if _private(text) and text not in ours:
                    problems.append(f"{where}:{node.lineno} reaches {text!r} by name")
    assert not problems, "use or extend sidecar/seams instead:\n" + "\n".join(problems)


def _classes_outside_seams() -> list[tuple[str, type]]:
    found = []
    for path in _outside_seams():
        if path.name == "__main__.py":
            continue  # importing it runs the CLI
        module = importlib.import_module(_module(path))
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and isinstance(cls := getattr(module, node.name, None), type):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", cls))
    return found


def test_no_class_overrides_or_reads_a_private_member_of_a_dependencys_class() -> None:
    problems = []
    for where, cls in _classes_outside_seams():
        theirs = [base for base in cls.__mro__[1:] if not base.__module__.startswith("sidecar") and base is not object]
        if not theirs:
            continue
        source = ast.parse(inspect.getsource(cls))
        used = {
            node.attr
            for node in ast.walk(source)
            if isinstance(node, ast.Attribute) and _private(node.attr) and ast.unparse(node.value) in ("self", "cls")
        }
        defined = {
            node.name
            for node in ast.walk(source)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name)
        }
        for name in sorted(used | defined):
            owner = next((base for base in theirs if name in vars(base)), None)
            if owner is not None:
                problems.append(f"{where} {cls.__name__} reaches {owner.__module__}.{owner.__qualname__}.{name}")
    assert not problems, "use or extend sidecar/seams instead:\n" + "\n".join(problems)
