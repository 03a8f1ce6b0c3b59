"""PackedReads: the dequantization of a layer's slots from the pool's packed buffers, the one
read every path ends in (the views, the batch and decode caches, the scratch: :mod:`.lazy_reads`).

A token-axis layer whose K and V share a grid dequantizes both in one call (:mod:`.cpu_writes`'
pair codec, CPU torch path); otherwise each side through the pool's ``gather`` op (the torch
reference, or the Triton kernel on CUDA). A channel-axis side reads through its
:class:`ChannelPages` (packed pages dequantized, the filling pages' staged fp values). Smoothed
keys come out in fp32, are multiplied by λ and only then rounded (:class:`LayerLambdas`).
"""

from __future__ import annotations

import torch

from .cpu_writes.kv_pair import dequantize_pair
from .geometry import PoolGeometry
from .ops import PoolOps
from .stored_layers import StoredLayers

__all__ = ["PackedReads"]


class PackedReads:
    """Reads of the pool's local layers from their ``stored`` packed buffers: ``head_dim`` and
    the model dtype from ``geometry``, the token-axis dequantizer ``ops.gather``."""

    def __init__(self, stored: StoredLayers, geometry: PoolGeometry, ops: PoolOps) -> None:
        self._stored = stored  # the packed buffers, specs, grids, pages and λ the writer shares
        self._gather = ops.gather
        self._head_dim = geometry.head_dim
        self._dtype = geometry.dtype

    def read_kv(self, local: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [len(loc), heads, head_dim] (model dtype) of slots ``loc``."""
        shared = self._stored.pairs[local]
        if shared is None:
            return self.read_one(local, "k", loc), self.read_one(local, "v", loc)
        spec, idx = self._stored.specs[local], loc.long()
        rows = (self._stored.k_buffer[local][idx], self._stored.v_buffer[local][idx])
        dtype = self._stored.lambdas.values_dtype(local)  # fp32 for smoothed keys
        kv = dequantize_pair(*rows, spec.k, spec.v, shared, self._head_dim, dtype)
        return self._stored.lambdas.read_back(local, *kv)

    def read_one(self, local: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """Dequantized K (``which="k"``) or V [len(loc), heads, head_dim] of slots ``loc``."""
        pages = self._stored.channels.side(local, which)
        if pages is not None:
            return pages.read(loc)
        spec, planes = self._stored.specs[local], self._stored.in_planes(local, which)
        if which == "v":
            v_buffer = self._stored.v_buffer[local]
            return self._gather(v_buffer, loc, spec.v, self._head_dim, self._dtype, planes=planes)
        dtype = self._stored.lambdas.values_dtype(local)
        k_buffer = self._stored.k_buffer[local]
        k = self._gather(k_buffer, loc, spec.k, self._head_dim, dtype, planes=planes)
        return self._stored.lambdas.read_back(local, k, None)[0]
