"""The package's imports point down. Every module stands on a floor; no import (also the lazy
ones inside functions) runs up to a higher floor, no module imports (directly or through
others) a module that imports it back, and the core never reaches SGLang or vLLM. Read from the
source, so it runs without SGLang, vLLM or Triton installed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kvtuner"

# Bottom to top, by a module's top-level part ("" = kvtuner/__init__.py, whose verbs load lazily).
# Imports within a floor are free. The runtimes stand below calibration: calibration and the
# search measure through them (the HF packed cache, the vLLM plans).
FLOORS = (
    {"_version", "errors", "placement"},
    {"quant"},  # formats, packing, their kernels
    {"profile", "attention"},  # the profile schema; attention over packed rows
    {"search_spaces", "models"},  # what a search may choose (budget too); where a model comes from
    {"runtime_loader"},  # HF cache, vLLM plans, SGLang pool, engine exports
    {"calibration"},
    {"evaluation"},
    {"tuner"},
    {"cli", "__main__", ""},
)
# Never reached from the core: SGLang's and vLLM's packages, and kvtuner's SGLang runtime.
FOREIGN_RUNTIMES = ("sglang", "vllm")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(module: str, is_package: bool, node: ast.AST, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    if base in known and len(found) < len(node.names):
        found.add(base)  # names defined in the module itself (or its package __init__)
    return found


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: (p, ast.parse(p.read_text(encoding="utf-8"))) for m, p in paths.items()}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package counts as its ``__init__``)."""
    trees = _trees()
    known = set(trees)
    graph = {}
    for module, (path, tree) in trees.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(module, is_package, node, known)
        graph[module] = edges - {module}
    return graph


def outside_imports() -> dict[str, set[str]]:
    """Module -> top-level names of the packages outside kvtuner that it imports."""
    found: dict[str, set[str]] = {}
    for module, (_, tree) in _trees().items():
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        found[module] = names - {"kvtuner"}
    return found


def floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    for level, parts in enumerate(FLOORS):
        if part in parts:
            return level
    raise AssertionError(f"{module}: its part {part!r} stands on no floor; add it to FLOORS")


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair whose imported module stands on a higher floor."""
    return {(a, b) for a, bs in graph.items() for b in bs if floor_of(b) > floor_of(a)}


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every module it imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "kvtuner.runtime_loader.sglang.pool.store" in graph  # the walk sees the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_stands_on_a_floor():
    for module in import_graph():
        floor_of(module)
    with pytest.raises(AssertionError, match="'newpart' stands on no floor"):
        floor_of("kvtuner.newpart.x")


def test_the_rule_sees_an_import_that_runs_up():
    graph = {"kvtuner.quant.a": {"kvtuner.tuner.b", "kvtuner.errors"}, "kvtuner.tuner.b": set()}
    assert upward_imports(graph) == {("kvtuner.quant.a", "kvtuner.tuner.b")}
    assert upward_imports({"kvtuner": {"kvtuner.cli.main"}, "kvtuner.cli.main": set()}) == set()


def test_no_import_runs_up_a_floor():
    upward = [f"{a} -> {b}" for a, b in sorted(upward_imports(import_graph()))]
    assert not upward, f"imports that run up a floor: {upward}"


def test_the_core_never_reaches_sglang_or_vllm():
    """Every module but the CLI and kvtuner's SGLang runtime (so also ``import kvtuner`` with
    its verbs) never imports SGLang, vLLM or the SGLang runtime, directly or through others."""
    graph, outside = import_graph(), outside_imports()
    sglang_runtime = "kvtuner.runtime_loader.sglang"
    assert "sglang" in outside[f"{sglang_runtime}.pool.store"]  # the walk sees them
    core = [m for m in graph if m.split(".")[1:2] not in (["cli"], ["__main__"])]
    for module in (m for m in core if not m.startswith(sglang_runtime)):
        for dep in reached(graph, module):
            foreign = sorted(outside[dep] & set(FOREIGN_RUNTIMES))
            assert not foreign, f"{module} reaches {foreign} through {dep}"
            assert not dep.startswith(sglang_runtime), f"{module} reaches {dep}"
