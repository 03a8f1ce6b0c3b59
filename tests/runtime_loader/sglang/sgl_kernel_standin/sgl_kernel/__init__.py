"""TEST-ONLY stand-in for the ``sgl_kernel`` package, so the real SGLang serves on a CPU box.

The PyPI ``sglang-kernel`` wheel is a CUDA build: importing it needs ``libcuda.so.1``, and it has
no ``*_cpu`` ops. SGLang's CPU path imports ``copy_all_layer_kv_cache_cpu`` from ``sgl_kernel`` at
module level; every other CPU kernel use is guarded by an availability check with a pure-torch
fallback. This package (first on ``PYTHONPATH`` of the server process only):
- loads no native library, so ``torch.ops.sgl_kernel`` stays empty and SGLang takes its
  ``forward_native`` torch paths;
- keeps the real package's pure-Python submodules importable (its folder joins ``__path__``);
- implements ``copy_all_layer_kv_cache_cpu`` with ctypes ``memmove``;
- turns any other name into a function that raises a clear error when called.
See docs/serving.md ("On a CPU"). Never installed, never part of the kvtuner product.
"""

from __future__ import annotations

import ctypes
import os
import sys

__version__ = "0.0.0+kvtuner-test-standin"


def _real_package_dirs() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sgl_kernel")
        if os.path.isdir(candidate) and os.path.abspath(candidate) != here:
            found.append(candidate)
    return found


# Submodules such as sgl_kernel.scalar_type resolve from the installed package's folder.
__path__ = [os.path.dirname(os.path.abspath(__file__)), *_real_package_dirs()]


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """For each buffer i (base address data_ptrs[i], rows of strides[i] bytes) copy row
    src_loc[j] to row tgt_loc[j]; the CPU op SGLang uses to move KV slots."""
    ptrs = [int(p) for p in data_ptrs.tolist()]
    row_bytes = [int(s) for s in strides.tolist()]
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist(), strict=True))
    for base, size in zip(ptrs, row_bytes, strict=True):
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(base + int(tgt) * size, base + int(src) * size, size)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not available in the CPU test stand-in (no native kernels)"
        )

    _missing.__name__ = name
    return _missing
