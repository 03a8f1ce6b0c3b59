"""ReadPlan: how the kvtuner pool serves reads, the one input its :class:`ReadState` is built
from (besides the pool's geometry)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..cell_size import READ_MODES
from .batch_reads import ReadKV
from .view import DequantizedView

__all__ = ["ReadOne", "ReadPlan"]

# read_one(layer_id, "k" or "v", loc int [n]) -> values [n, heads, head_dim] (model dtype)
ReadOne = Callable[[int, str, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ReadPlan:
    """``mode``: ``"lazy"``, ``"packed"`` or ``"scratch"`` (see ``store.py``);
    ``decode_cache_tokens``: the lazy mode's decode cache bound (rows per layer; 0: off);
    ``read_kv``/``read_one``: the pool's reads by layer id, which the caches and the writer
    call, so what they serve is what the pool reads; ``views``: per layer id, its (K, V)
    :class:`DequantizedView` (lazy mode only)."""

    mode: str
    decode_cache_tokens: int
    read_kv: ReadKV
    read_one: ReadOne
    views: Mapping[int, tuple[DequantizedView, DequantizedView]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in READ_MODES:
            raise ValueError(f"read mode must be one of {READ_MODES}, got {self.mode!r}")
        if self.decode_cache_tokens < 0:
            raise ValueError(f"decode_cache_tokens must be >= 0, got {self.decode_cache_tokens}")
        if self.mode != "lazy" and (self.views or self.decode_cache_tokens):
            raise ValueError(
                f"views and a decode cache serve the lazy mode only, not {self.mode!r}"
            )
