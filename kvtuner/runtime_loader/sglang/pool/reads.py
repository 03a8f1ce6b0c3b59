"""PackedReads: the dequantization of a layer's slots from the pool's packed buffers, the one
read every path ends in (the views, the batch and decode caches, the scratch: :mod:`.lazy_reads`).

A token-axis layer whose K and V share a grid dequantizes both in one call (:mod:`.cpu_writes`'
pair codec, CPU torch path); otherwise each side through the pool's ``gather`` op (the torch
reference, or the Triton kernel on CUDA). A channel-axis side reads through its
:class:`ChannelPages` (packed pages dequantized, the filling pages' staged fp values). Smoothed
keys come out in fp32, are multiplied by λ and only then rounded (:class:`KeySmoothing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ....profile import LayerSpec
from ....quant import QuantSpec
from .channels import ChannelSides
from .cpu_writes.kv_pair import dequantize_pair
from .smoothing import KeySmoothing

__all__ = ["PackedReads"]

Gather = Callable[[torch.Tensor, torch.Tensor, QuantSpec, int, torch.dtype], torch.Tensor]


class PackedReads:
    """Reads of the pool's local layers. ``k_buffer``/``v_buffer``: the packed buffers per
    local layer (the pool's lists); ``specs``: their LayerSpecs; ``pairs``: the grid K and V
    share per local layer (None: read each side); ``gather``: the token-axis dequantizer."""

    def __init__(
        self,
        k_buffer: Sequence[torch.Tensor],
        v_buffer: Sequence[torch.Tensor],
        *,
        specs: Sequence[LayerSpec],
        pairs: Sequence[QuantSpec | None],
        channels: ChannelSides,
        smoothing: KeySmoothing,
        gather: Gather,
        head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        self._k, self._v, self._specs, self._pairs = k_buffer, v_buffer, specs, pairs
        self._channels, self._smoothing, self._gather = channels, smoothing, gather
        self._head_dim, self._dtype = head_dim, dtype

    def read_kv(self, local: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [len(loc), heads, head_dim] (model dtype) of slots ``loc``."""
        shared = self._pairs[local]
        if shared is None:
            return self.read_one(local, "k", loc), self.read_one(local, "v", loc)
        spec, idx = self._specs[local], loc.long()
        rows = (self._k[local][idx], self._v[local][idx])
        dtype = self._smoothing.values_dtype(local)  # fp32 for smoothed keys
        kv = dequantize_pair(*rows, spec.k, spec.v, shared, self._head_dim, dtype)
        return self._smoothing.read_back(local, *kv)

    def read_one(self, local: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """Dequantized K (``which="k"``) or V [len(loc), heads, head_dim] of slots ``loc``."""
        pages = self._channels.side(local, which)
        if pages is not None:
            return pages.read(loc)
        spec = self._specs[local]
        if which == "v":
            return self._gather(self._v[local], loc, spec.v, self._head_dim, self._dtype)
        dtype = self._smoothing.values_dtype(local)
        k = self._gather(self._k[local], loc, spec.k, self._head_dim, dtype)
        return self._smoothing.read_back(local, k, None)[0]
