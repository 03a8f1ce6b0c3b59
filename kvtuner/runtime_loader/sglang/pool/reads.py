"""The pool's read path: what attention backends get from ``get_key_buffer``/``get_value_buffer``.

- ``"lazy"``: a :class:`DequantizedView` per layer and K/V; indexing it reads through the
  decode cache (a request's K/V, extended by the new token), else a range of the announced
  batch (:class:`BatchReads`), else the slots directly. Every read equals :meth:`read_kv`.
- ``"scratch"``: the announced slots dequantized into a layer-sized scratch, once per layer.
- ``"packed"`` (the kvtuner attention backend): the packed uint8 rows themselves
  (:meth:`PoolReads.packed_rows`); the backend's kernels dequantize in registers.

A channel-axis side reads through its :class:`ChannelPages` (packed pages dequantized, the
filling pages' staged fp values), in every mode.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .channel_pages import ChannelPages
from .cpu_writes.kv_pair import dequantize_pair
from .lazy_reads.view import DequantizedView

__all__ = ["PoolReads", "SlotMap"]


class SlotMap(Protocol):
    """Translates the slots a backend reads with into the pool's own (``swa_pool.WindowSlots``)."""

    def __call__(self, loc: torch.Tensor) -> torch.Tensor: ...

    def forget(self) -> None: ...


class PoolReads:
    """Mixin of :class:`KVTunerMHATokenToKVPool`: reads. Needs the packed buffers, ``_pairs``,
    ``gather``, ``_cache``, ``_batch``, ``_views`` and, in scratch mode, the scratch tensors."""

    # full-pool slots -> this pool's slots, for reads (SWAKVPool's window sub-pool; swa_pool.py)
    read_slot_map: SlotMap | None = None

    def read_kv(self, layer_id: int, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [len(loc), heads, head_dim] (model dtype) of slots ``loc``."""
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        shared = self._pairs[local]
        if shared is None:
            return self.read_one(layer_id, "k", loc), self.read_one(layer_id, "v", loc)
        idx = loc.long()
        rows = (self.k_buffer[local][idx], self.v_buffer[local][idx])
        dtype = self._values_dtype(local)  # fp32 for smoothed keys (see pool_smoothing)
        kv = dequantize_pair(*rows, spec.k, spec.v, shared, self.head_dim, dtype)
        return self._read_back(local, *kv)

    def read_one(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """Dequantized K (``which="k"``) or V [len(loc), heads, head_dim] of slots ``loc``."""
        local, spec = layer_id - self.start_layer, self.layer_spec(layer_id)
        stores = self._channel[local]
        if stores is not None and stores[which == "v"] is not None:
            return stores[which == "v"].read(loc)
        buffers, qs = (self.k_buffer, spec.k) if which == "k" else (self.v_buffer, spec.v)
        if which == "v":
            return self.gather(buffers[local], loc, qs, self.head_dim, self.dtype)
        k = self.gather(buffers[local], loc, qs, self.head_dim, self._values_dtype(local))
        return self._read_back(local, k, None)[0]

    def read_for_view(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """What a :class:`DequantizedView` returns for ``view[loc]`` (``loc``: int [n]): the
        request's cached rows (new slots dequantized), else a range of the announced batch
        (dequantized once per layer), else a direct read of ``loc``. A window sub-pool of
        SWAKVPool is handed full-pool slots: ``read_slot_map`` translates them first."""
        if self.read_slot_map is not None:
            loc = self.read_slot_map(loc)
        if self._cache.enabled:
            kv = self._cached_pair(layer_id, loc)
            if kv is not None:
                return kv[0] if which == "k" else kv[1]
        served = self._batch.serve(layer_id, which, loc, self.read_kv)
        return served if served is not None else self.read_one(layer_id, which, loc)

    def _cached_pair(self, layer_id: int, loc: torch.Tensor):
        """The decode cache's (K, V) of ``loc``. torch_native indexes K then V of a layer with
        the same index tensor object: the V read reuses the K read's answer (no write between;
        the caller does not change its index tensor in place between the two reads)."""
        last = self._last_read
        if last is not None and last[0] is loc and last[1] == layer_id:
            return last[2]
        kv = self._cache.serve(layer_id, loc, self.read_kv)
        self._last_read = (loc, layer_id, kv) if kv is not None else None
        return kv

    def prepare_reads(self, slots: torch.Tensor | None) -> None:
        """Announce the slots the next forward reads, request by request (int64 [n]).
        Scratch mode: only these are dequantized, None forbids reads. Lazy mode: a speed-up
        (one dequantization of the batch per layer); reads work without it."""
        if self.read_slot_map is not None and slots is not None:
            self.read_slot_map.forget()
            slots = self.read_slot_map(slots)
        self._read_slots = slots
        self._materialized = None
        self._cache.new_step()
        self._last_read = None
        self._batch.announce(slots if self.read_mode == "lazy" else None)

    def _materialize(self, layer_id: int) -> None:
        if self._materialized == layer_id:
            return
        if self._read_slots is None:
            raise RuntimeError(
                "kvtuner pool: K/V read before the batch's slots were announced (prepare_reads); "
                "this read path is not supported by the v1 pool"
            )
        k, v = self.read_kv(layer_id, self._read_slots)
        self._k_scratch.index_copy_(0, self._read_slots, k)
        self._v_scratch.index_copy_(0, self._read_slots, v)
        self._materialized = layer_id

    def channel_keys(self, layer_id: int) -> ChannelPages | None:
        """Layer ``layer_id``'s channel-axis key pages (blocks, staged filling pages and their
        device ``stage_rows``), or None for token-axis keys."""
        stores = self._channel[layer_id - self.start_layer]
        return None if stores is None else stores[0]

    def packed_rows(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_id``'s packed K and V rows, uint8 ``[size + page, heads, row_bytes]``."""
        local = layer_id - self.start_layer
        return self.k_buffer[local], self.v_buffer[local]

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "lazy":
            return self._views[layer_id - self.start_layer][0]
        if self.read_mode == "packed":
            return self.packed_rows(layer_id)[0]
        self._materialize(layer_id)
        return self._k_scratch

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor | DequantizedView:
        if self.read_mode == "lazy":
            return self._views[layer_id - self.start_layer][1]
        if self.read_mode == "packed":
            return self.packed_rows(layer_id)[1]
        self._materialize(layer_id)
        return self._v_scratch

    def get_kv_buffer_shape(self):
        """Shapes of what the backends read: [rows, heads, head_dim] (not the packed rows)."""
        shape = torch.Size((self.size + self.page_size, self.head_num, self.head_dim))
        return shape, shape
