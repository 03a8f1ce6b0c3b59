"""The package's imports point one way: no module imports (directly or through others) a module
that imports it back. Read from the source (every ``import``, also the lazy ones inside
functions), so it runs without SGLang, vLLM or Triton installed."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvtuner"


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


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package counts as its ``__init__``)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(module, is_package, node, known)
        graph[module] = edges - {module}
    return graph


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


def test_the_core_does_not_import_a_runtime():
    """Tuner, calibration, search spaces, profile and quant never import the SGLang runtime."""
    graph = import_graph()
    core = [m for m in graph if m.count(".") and m.split(".")[1] in _CORE]
    for module in core:
        runtime = {m for m in graph[module] if m.startswith("kvtuner.runtime_loader.sglang")}
        assert not runtime, f"{module} imports {sorted(runtime)}"


_CORE = {"tuner", "calibration", "search_spaces", "profile", "quant", "attention"}


def test_the_sglang_runtime_layout_stays_small():
    """Every folder of the SGLang runtime holds at most 12 files, each at most 300 lines."""
    root = PACKAGE / "runtime_loader" / "sglang"
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        files = [p for p in folder.iterdir() if p.is_file() and p.suffix == ".py"]
        assert len(files) <= 12, f"{folder} holds {len(files)} files"
        for path in files:
            lines = len(path.read_text(encoding="utf-8").splitlines())
            assert lines <= 300, f"{path} has {lines} lines"
