"""Every Triton kernel compiles on the Triton a GPU runs, not only on the one installed here.

CI and the development machines build the kernels with the Triton torch 2.13 brings (3.9);
the GPU machines lent to this project run torch 2.11 with Triton 3.6, whose frontend rejects
constructs 3.9 takes. One reached main: ``NG == RG == 2`` in a ``@triton.jit`` function
("simultaneous multiple comparison is not supported"), which would have failed every decode
launch there; a build of ``benchmarks/kernel_resources.py`` under Triton 3.6 (a CPU venv, the
recipe in docs/results/gpu.md) found it. The syntax is read here, in CI, without that Triton."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvtuner"


def jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The module's functions decorated ``triton.jit`` or ``jit`` (with or without arguments)."""

    def is_jit(d: ast.expr) -> bool:
        d = d.func if isinstance(d, ast.Call) else d
        name = d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
        return name == "jit"

    return [
        f
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef) and any(is_jit(d) for d in f.decorator_list)
    ]


def chained_comparisons(source: str) -> list[str]:
    """``name:line`` of each chained comparison (``a == b == c``, ``0 <= i < n``) inside a jit
    function of ``source``."""
    return [
        f"{f.name}:{node.lineno}"
        for f in jit_functions(ast.parse(source))
        for node in ast.walk(f)
        if isinstance(node, ast.Compare) and len(node.ops) > 1
    ]


def test_chained_comparisons_are_found_in_jit_functions_only():
    source = (
        "import triton\n"
        "@triton.jit\ndef k(a, b):\n    if a == b == 2:\n        pass\n"
        "def host(a):\n    return 0 <= a < 3\n"
    )
    assert chained_comparisons(source) == ["k:4"]


def test_no_kernel_uses_a_construct_triton_3_6_rejects():
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := chained_comparisons(path.read_text()))
    }
    assert found == {}, f"chained comparisons in jit code (Triton 3.6 rejects them): {found}"
