"""The pool's write path: ``set_kv_buffer`` quantizes, packs and stores one layer's new K/V rows.

- CPU, quantized token-axis K and V (every servable profile but 16-bit layers), writes of at
  most ``SMALL_WRITE_TOKENS`` tokens (decode steps): a :class:`PairCodec` per layer (numpy; one
  grid pass for K and V), the rows stored through numpy views of the packed buffers (no torch
  indexing op), and the values they dequantize to handed to the decode cache. A decode step
  costs a few dozen numpy calls per layer.
- CPU otherwise (prefill, 16-bit layers, tests that swap in other quantizer ops): the torch
  reference, K and V in one call when they share a grid (:mod:`.kv_pair`).
- CUDA/ROCm: the Triton scatter kernels, K and V separately.
- Layers with a channel-axis side: that side goes to its :class:`ChannelPages` (staged, packed
  a page at a time with the torch reference), the other side through the path above for one
  tensor; the decode cache forgets the slots of every page packed by the write.
"""

from __future__ import annotations

import numpy as np
import torch
from sglang.srt.mem_cache.memory_pool import unwrap_write_loc

from ....errors import KVTunerError
from ....quant import quantize
from ....quant.reference import quantize_dequantize
from .cpu_writes.cpu_codec import PairCodec
from .cpu_writes.kv_pair import quantize_pair, quantize_pair_values

__all__ = ["PoolWrites"]

# Writes of up to this many tokens (decode steps of up to 64 requests) take the numpy writer;
# larger ones (prefill) the torch reference, whose per-token cost is lower: numpy is ahead below
# ~64-96 tokens, behind above (1 thread, 3 heads x 64: 1.5x slower at 256 tokens). Same bytes.
SMALL_WRITE_TOKENS = 64


class PoolWrites:
    """Mixin of :class:`KVTunerMHATokenToKVPool`: writes. Needs ``k_buffer``/``v_buffer``,
    ``_pairs`` (shared grid per local layer), ``_codecs`` (PairCodec or None per local layer),
    ``_torch_cpu``, the decode cache ``_cache`` and the batch cache ``_batch``."""

    def _forget_reads(self, layer_id: int) -> None:
        """Rows of ``layer_id`` change: no read of the batch or of the scratch is current."""
        self._batch.invalidate()
        self._last_read = None
        if self._materialized == layer_id:
            self._materialized = None

    def on_rows_loaded(self, local_layer: int, slots: torch.Tensor) -> None:
        """HiCache loaded packed rows from host into ``slots`` (int64 [n]) of local layer
        ``local_layer``: what reads cached of those slots is stale."""
        layer_id = self.start_layer + local_layer
        self._forget_reads(layer_id)
        self._cache.on_write(layer_id, slots)

    def set_kv_buffer(
        self,
        layer,
        loc_info,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale=None,
        v_scale=None,
        layer_id_override=None,
        dcp_kv_mask=None,
    ) -> None:
        """Quantize, pack and scatter K/V[N, heads, head_dim] into slots ``loc``.
        (k_scale/v_scale are fp8-cache scales: unused, the pool stores model-dtype input.)"""
        if dcp_kv_mask is not None:
            raise KVTunerError("the kvtuner pool does not support decode context parallelism")
        loc, _, _ = unwrap_write_loc(loc_info)
        self._check_physical_write_loc(loc_info, "set_kv_buffer (kvtuner)")
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        local, n = layer_id - self.start_layer, loc.shape[0]
        self._forget_reads(layer_id)
        if n == 0:
            return
        shape = (n, self.head_num, self.head_dim)
        k = cache_k if cache_k.shape == shape else cache_k.reshape(shape)
        v = cache_v if cache_v.shape == shape else cache_v.reshape(shape)
        k = self._smoothed_keys(local, k)  # key smoothing: fp32 k / λ
        if self._channel[local] is not None:
            self._write_channel_layer(layer_id, loc, k, v)
            return
        if not self._torch_cpu:
            self._cache.on_write(layer_id, loc)  # a tensor: read back only if entries exist
            self._scatter_each(local, loc, k, v)
            return
        slots = loc.tolist()  # Python ints: numpy row indices, the decode cache's bookkeeping
        self._cache.on_write(layer_id, slots)
        if self._codecs[local] is not None and n <= SMALL_WRITE_TOKENS:
            k_hat, v_hat = self._write_numpy(local, slots, k, v)
        else:
            k_rows, v_rows, k_hat, v_hat = self._quantize(local, k, v)
            idx = loc.long()
            self.k_buffer[local][idx], self.v_buffer[local][idx] = k_rows, v_rows
        if self._cache.enabled:
            self._cache.remember(layer_id, slots, *self._read_back(local, k_hat, v_hat))

    def _write_channel_layer(self, layer_id: int, loc, k: torch.Tensor, v: torch.Tensor):
        """A layer with a channel-axis side: stage/pack that side, quantize the other."""
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        buffers, stores = (self.k_buffer[local], self.v_buffer[local]), self._channel[local]
        packed: set[int] = set()
        for x, qs, buffer, pages in zip((k, v), (spec.k, spec.v), buffers, stores, strict=True):
            if pages is not None:
                packed.update(pages.write(loc, x))
            elif self._torch_cpu:
                buffer[loc.long()] = quantize(x, qs)
            else:
                self.scatter(buffer, loc, x, qs)
        slots = loc.tolist()
        page = self.page_size  # the packed pages' earlier slots now read their quantized values
        self._cache.on_write(layer_id, slots + [p * page + i for p in packed for i in range(page)])
        if self._cache.enabled:
            self._cache.remember(layer_id, slots, *self.read_kv(layer_id, loc))

    def _write_numpy(self, local: int, slots: list[int], k: torch.Tensor, v: torch.Tensor):
        """PairCodec rows into the packed buffers' numpy views; returns the values (or None)."""
        dtype = self._values_dtype(local) if self._cache.enabled else None
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
        k, v = self.k_buffer[local], self.v_buffer[local]
        cached = self._host.get(local)
        if cached is None or cached[0] is not k or cached[1] is not v:
            cached = self._host[local] = (k, v, k.numpy(), v.numpy())
        return cached[2], cached[3]

    def _quantize(self, local: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """Torch reference: rows of K, V [n, heads, D] and, for the decode cache, the values
        they dequantize to (model dtype; None when the cache is off)."""
        spec, shared = self.layer_spec(self.start_layer + local), self._pairs[local]
        if not self._cache.enabled:
            if shared is not None:
                return (*quantize_pair(k, v, spec.k, spec.v, shared), None, None)
            return quantize(k, spec.k), quantize(v, spec.v), None, None
        dtype = self._values_dtype(local)  # fp32 for smoothed keys (see pool_smoothing)
        if shared is not None:
            return quantize_pair_values(k, v, spec.k, spec.v, shared, dtype)
        (k_rows, k_hat), (v_rows, v_hat) = (
            quantize_dequantize(x, qs, dtype) for x, qs in ((k, spec.k), (v, spec.v))
        )
        return k_rows, v_rows, k_hat, v_hat

    def _scatter_each(self, local: int, loc, k: torch.Tensor, v: torch.Tensor) -> None:
        spec = self.layer_spec(self.start_layer + local)
        self.scatter(self.k_buffer[local], loc, k, spec.k)
        self.scatter(self.v_buffer[local], loc, v, spec.v)

    def _write_codecs(self) -> list[PairCodec | None]:
        """Per local layer: the numpy writer, or None (torch path; see the module doc)."""
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        return [
            PairCodec(s.k, s.v, self.head_num, self.head_dim)
            if self._torch_cpu and PairCodec.supports(s.k, s.v)
            else None
            for s in specs
        ]
