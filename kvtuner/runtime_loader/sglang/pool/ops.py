"""PoolOps: the quantizer ops the pool's parts write and read its packed rows with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Gather", "PoolOps", "Scatter", "ScatterKV"]

# scatter(rows, loc, x [N, heads, D], spec, *, planes): quantize x into packed ``rows`` at
# slots ``loc`` (``planes``: laid out as kvtuner.quant.planes)
Scatter = Callable[..., None]
# scatter_kv(k_rows, v_rows, loc, k, v, k_spec, v_spec, *, planes): both sides' scatter (one
# launch on CUDA)
ScatterKV = Callable[..., None]
# gather(rows, loc, spec, head_dim, dtype, *, planes) -> values [N, heads, head_dim] of ``loc``
Gather = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class PoolOps:
    """The quantizer ops: token-axis ``scatter`` (``scatter_kv``: K and V)/``gather`` and the
    channel-axis page ``packer``; ``torch_cpu``: they are the torch reference on CPU (numpy
    writer, pair codec)."""

    scatter: Scatter
    scatter_kv: ScatterKV
    gather: Gather
    packer: Callable[..., None]
    torch_cpu: bool
