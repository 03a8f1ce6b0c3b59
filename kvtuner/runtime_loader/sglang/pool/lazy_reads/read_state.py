"""ReadState: what the pool's lazy and scratch read modes serve reads from, and when it is stale.

- ``"lazy"``: a :class:`DequantizedView` per layer and K/V; indexing it reads through the
  decode cache (a request's K/V, extended by the new token), else a range of the announced
  batch (:class:`BatchReads`), else the slots directly. Every read equals the pool's ``read_kv``.
- ``"scratch"``: the announced slots dequantized into a layer-sized scratch, once per layer.

(The ``"packed"`` mode serves the packed rows themselves and keeps no read state.) Writes tell
it which layer changed (:meth:`forget`, and the decode cache its slots); a move of slots or a
HiCache load drops what it holds of them.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..geometry import PoolGeometry
from .batch_reads import BatchReads
from .decode_cache import DecodeCache
from .read_plan import ReadPlan
from .view import DequantizedView

__all__ = ["ReadState", "SlotMap"]


class SlotMap(Protocol):
    """Translates the slots a backend reads with into the pool's own (``swa.WindowSlots``)."""

    def __call__(self, loc: torch.Tensor) -> torch.Tensor: ...

    def forget(self) -> None: ...


class ReadState:
    """What reads are served from, built from the pool's ``plan`` and ``geometry``: the views
    (lazy mode), the scratch (scratch mode: K and V ``[rows, heads, head_dim]`` in the model
    dtype, as backends expect; else None), the batch reads and the decode cache (off:
    ``max_tokens`` 0). Every read ends in the plan's ``read_kv``/``read_one``."""

    def __init__(self, plan: ReadPlan, geometry: PoolGeometry) -> None:
        g = geometry
        self.plan = plan
        self.cache = DecodeCache(plan.decode_cache_tokens, g.rows, g.device)
        self.batch = BatchReads()
        self.scratch: tuple[torch.Tensor, torch.Tensor] | None = None
        if plan.mode == "scratch":
            shape = (g.rows, g.heads, g.head_dim)
            self.scratch = tuple(torch.zeros(shape, dtype=g.dtype, device=g.device) for _ in "kv")
        self.slot_map: SlotMap | None = None  # full-pool -> own slots (SWAKVPool's window pool)
        self._views = plan.views
        self._read_kv = plan.read_kv
        self._read_one = plan.read_one
        self._slots: torch.Tensor | None = None  # the announced slots
        self._materialized: int | None = None  # the layer the scratch holds
        self._last: tuple | None = None  # (index tensor, layer, (K, V)) of the last cached read

    def buffer(self, layer_id: int, which: str) -> torch.Tensor | DequantizedView:
        """What ``get_key_buffer`` (``which="k"``) or ``get_value_buffer`` hands a backend."""
        if self.plan.mode == "lazy":
            return self._views[layer_id][which == "v"]
        self._materialize(layer_id)
        return self.scratch[which == "v"]

    def for_view(self, layer_id: int, which: str, loc: torch.Tensor) -> torch.Tensor:
        """What a :class:`DequantizedView` returns for ``view[loc]`` (``loc``: int [n]): the
        request's cached rows (new slots dequantized), else a range of the announced batch
        (dequantized once per layer), else a direct read of ``loc``. A window sub-pool of
        SWAKVPool is handed full-pool slots: ``slot_map`` translates them first."""
        if self.slot_map is not None:
            loc = self.slot_map(loc)
        if self.cache.enabled:
            kv = self._cached_pair(layer_id, loc)
            if kv is not None:
                return kv[0] if which == "k" else kv[1]
        served = self.batch.serve(layer_id, which, loc, self._read_kv)
        return served if served is not None else self._read_one(layer_id, which, loc)

    def _cached_pair(self, layer_id: int, loc: torch.Tensor):
        """The decode cache's (K, V) of ``loc``. torch_native indexes K then V of a layer with
        the same index tensor object: the V read reuses the K read's answer (no write between;
        the caller does not change its index tensor in place between the two reads)."""
        last = self._last
        if last is not None and last[0] is loc and last[1] == layer_id:
            return last[2]
        kv = self.cache.serve(layer_id, loc, self._read_kv)
        self._last = (loc, layer_id, kv) if kv is not None else None
        return kv

    def prepare(self, slots: torch.Tensor | None) -> None:
        """Announce the slots the next forward reads, request by request (int64 [n]).
        Scratch mode: only these are dequantized, None forbids reads. Lazy mode: a speed-up
        (one dequantization of the batch per layer); reads work without it."""
        if self.slot_map is not None and slots is not None:
            self.slot_map.forget()
            slots = self.slot_map(slots)
        self._slots = slots
        self._materialized = self._last = None
        self.cache.new_step()
        self.batch.announce(slots if self.plan.mode == "lazy" else None)

    def forget(self, layer_id: int) -> None:
        """Rows of ``layer_id`` change: no read of the batch or of the scratch is current."""
        self.batch.invalidate()
        self._last = None
        if self._materialized == layer_id:
            self._materialized = None

    def on_rows_loaded(self, layer_id: int, slots: torch.Tensor) -> None:
        """Packed rows were copied into ``slots`` (int64 [n]) of ``layer_id`` (HiCache)."""
        self.forget(layer_id)
        self.cache.on_write(layer_id, slots)

    def drop(self) -> None:
        """Rows moved between slots: nothing held is current."""
        self.cache.clear()
        self.batch.invalidate()
        self._last = self._materialized = None

    def scratch_bytes(self) -> int:
        """Bytes of the dequant scratch (0 without one)."""
        return sum(t.numel() * t.element_size() for t in self.scratch or ())

    def _materialize(self, layer_id: int) -> None:
        if self._materialized == layer_id:
            return
        if self._slots is None:
            raise RuntimeError(
                "kvtuner pool: K/V read before the batch's slots were announced (prepare_reads); "
                "this read path is not supported by the v1 pool"
            )
        k, v = self._read_kv(layer_id, self._slots)
        self.scratch[0].index_copy_(0, self._slots, k)
        self.scratch[1].index_copy_(0, self._slots, v)
        self._materialized = layer_id
