"""PoolWriter: the pool's write path; ``set_kv_buffer`` quantizes, packs and stores one layer's
new K/V rows through it.

- CPU, quantized token-axis K and V (every servable profile but 16-bit layers), writes of at
  most ``SMALL_WRITE_TOKENS`` tokens (decode steps): a :class:`PairCodec` per layer (numpy; one
  grid pass for K and V), the rows stored through numpy views of the packed buffers (no torch
  indexing op), and the values they dequantize to handed to the decode cache. A decode step
  costs a few dozen numpy calls per layer.
- CPU otherwise (prefill, 16-bit layers, tests that swap in other quantizer ops): the torch
  reference, K and V in one call when they share a grid (:mod:`.cpu_writes.kv_pair`).
- CUDA/ROCm: the Triton scatter kernel, K and V in one launch (``ops.scatter_kv``).
- Layers with a channel-axis side: that side goes to its :class:`ChannelPages` (staged, packed
  a page at a time with the torch reference), the other side through the path above for one
  tensor; the decode cache forgets the slots of every page packed by the write.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ....profile import LayerSpec
from ....quant import QuantSpec, quantize
from ....quant.reference import quantize_dequantize
from .cpu_writes.cpu_codec import PairCodec
from .cpu_writes.kv_pair import pair_spec, quantize_pair, quantize_pair_values
from .geometry import PoolGeometry
from .lazy_reads.read_state import ReadState
from .ops import PoolOps
from .stored_layers import StoredLayers

__all__ = ["PoolWriter", "SMALL_WRITE_TOKENS", "shared_grids"]

# Writes of up to this many tokens (decode steps of up to 64 requests) take the numpy writer;
# larger ones (prefill) the torch reference, whose per-token cost is lower: numpy is ahead below
# ~64-96 tokens, behind above (1 thread, 3 heads x 64: 1.5x slower at 256 tokens). Same bytes.
SMALL_WRITE_TOKENS = 64


def shared_grids(specs: Sequence[LayerSpec], torch_cpu: bool) -> list[QuantSpec | None]:
    """Per local layer: the grid K and V share (one quantizer call for both), or None.
    CPU torch path only (the Triton kernels take one tensor per launch)."""
    return [pair_spec(s.k, s.v) if torch_cpu else None for s in specs]


class PoolWriter:
    """Writes into the ``stored`` layers' packed buffers (the pool's lists, per local layer).
    ``ops.torch_cpu``: the CPU torch path (numpy writer and reference; else ``ops.scatter_kv``,
    or ``ops.scatter`` a side); ``reads``: told which rows change (the decode cache gets the
    values written; a channel-axis layer's through the plan's ``read_kv``, the pool's read)."""

    def __init__(
        self, stored: StoredLayers, geometry: PoolGeometry, ops: PoolOps, reads: ReadState
    ) -> None:
        self._stored = stored  # the packed buffers, specs, grids, pages and λ the reads share
        self._reads = reads
        self._read_kv = reads.plan.read_kv
        self._scatter, self._scatter_kv = ops.scatter, ops.scatter_kv
        self._torch_cpu = ops.torch_cpu
        self._page = geometry.page
        self._shape = (geometry.heads, geometry.head_dim)
        # per local layer: the numpy writer, or None (torch path; see the module doc)
        self._codecs = [
            PairCodec(s.k, s.v, geometry.heads) if self._codec_fits(s) else None
            for s in self._stored.specs
        ]
        self._host: dict[int, tuple] = {}  # local layer -> numpy views of its packed buffers

    def _codec_fits(self, spec: LayerSpec) -> bool:
        return self._torch_cpu and PairCodec.supports(spec.k, spec.v)

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize, pack and store K/V [N, heads, head_dim] (or any shape of that many
        values) of layer ``layer_id`` into slots ``loc`` (int [N])."""
        local, n = layer_id - self._stored.start_layer, loc.shape[0]
        self._reads.forget(layer_id)
        if n == 0:
            return
        shape = (n, *self._shape)
        k = k if k.shape == shape else k.reshape(shape)
        v = v if v.shape == shape else v.reshape(shape)
        k = self._stored.lambdas.smoothed_keys(local, k)  # key smoothing: fp32 k / λ
        cache = self._reads.cache
        if self._stored.channels[local] is not None:
            self._write_channel_layer(layer_id, loc, k, v)
            return
        if not self._torch_cpu:
            cache.on_write(layer_id, loc)  # a tensor: read back only if entries exist
            spec = self._stored.specs[local]
            buffers = (self._stored.k_buffer[local], self._stored.v_buffer[local])
            self._scatter_kv(*buffers, loc, k, v, spec.k, spec.v, planes=self._stored.planes[local])
            return
        slots = loc.tolist()  # Python ints: numpy row indices, the decode cache's bookkeeping
        cache.on_write(layer_id, slots)
        if self._codecs[local] is not None and n <= SMALL_WRITE_TOKENS:
            k_hat, v_hat = self._write_numpy(local, slots, k, v)
        else:
            k_rows, v_rows, k_hat, v_hat = self._quantize(local, k, v)
            idx = loc.long()
            self._stored.k_buffer[local][idx], self._stored.v_buffer[local][idx] = k_rows, v_rows
        if cache.enabled:
            cache.remember(layer_id, slots, *self._stored.lambdas.read_back(local, k_hat, v_hat))

    def _write_channel_layer(self, layer_id: int, loc, k: torch.Tensor, v: torch.Tensor):
        """A layer with a channel-axis side: stage/pack that side, quantize the other."""
        stored = self._stored
        local = layer_id - stored.start_layer
        spec, buffers = stored.specs[local], (stored.k_buffer[local], stored.v_buffer[local])
        packed: set[int] = set()
        for x, qs, buffer, pages, planes in zip(
            (k, v), (spec.k, spec.v), buffers, stored.channels[local], stored.planes[local],
            strict=True,
        ):  # fmt: skip
            if pages is not None:
                packed.update(pages.write(loc, x))
            elif self._torch_cpu:
                buffer[loc.long()] = quantize(x, qs)
            else:
                self._scatter(buffer, loc, x, qs, planes=planes)
        slots, page, cache = loc.tolist(), self._page, self._reads.cache
        # the packed pages' earlier slots now read their quantized values
        cache.on_write(layer_id, slots + [p * page + i for p in packed for i in range(page)])
        if cache.enabled:
            cache.remember(layer_id, slots, *self._read_kv(layer_id, loc))

    def _write_numpy(self, local: int, slots: list[int], k: torch.Tensor, v: torch.Tensor):
        """PairCodec rows into the packed buffers' numpy views; returns the values (or None)."""
        dtype = self._stored.lambdas.values_dtype(local) if self._reads.cache.enabled else None
        k_rows, v_rows, k_hat, v_hat = self._codecs[local].encode(k, v, dtype)
        k_host, v_host = self._host_buffers(local)
        if len(slots) == 1:  # basic indexing: the cheapest numpy store
            k_host[slots[0]], v_host[slots[0]] = k_rows[0], v_rows[0]
        else:
            idx = np.asarray(slots)
            k_host[idx], v_host[idx] = k_rows, v_rows
        return k_hat, v_hat

    def _host_buffers(self, local: int) -> tuple[np.ndarray, np.ndarray]:
        """Numpy views (shared memory) of layer ``local``'s packed K and V buffers, made once
        per buffer tensor (rebuilt if the pool's buffers are ever replaced)."""
        k, v = self._stored.k_buffer[local], self._stored.v_buffer[local]
        cached = self._host.get(local)
        if cached is None or cached[0] is not k or cached[1] is not v:
            cached = self._host[local] = (k, v, k.numpy(), v.numpy())
        return cached[2], cached[3]

    def _quantize(self, local: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Torch reference: rows of K, V [n, heads, D] and, for the decode cache, the values
        they dequantize to (None when the cache is off)."""
        spec, shared = self._stored.specs[local], self._stored.pairs[local]
        if not self._reads.cache.enabled:
            if shared is not None:
                return (*quantize_pair(k, v, spec.k, spec.v, shared), None, None)
            return quantize(k, spec.k), quantize(v, spec.v), None, None
        dtype = self._stored.lambdas.values_dtype(local)  # fp32 for smoothed keys
        if shared is not None:
            return quantize_pair_values(k, v, spec.k, spec.v, shared, dtype)
        (k_rows, k_hat), (v_rows, v_hat) = (
            quantize_dequantize(x, qs, dtype) for x, qs in ((k, spec.k), (v, spec.v))
        )
        return k_rows, v_rows, k_hat, v_hat
