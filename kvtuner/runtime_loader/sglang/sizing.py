"""Bytes per token the kvtuner pool costs one rank: what SGLang divides its KV budget by.

Per layer the pool stores one packed K row and one packed V row per (token, KV head); on top,
the v1 read path keeps one layer-sized dequantized K and V scratch in the model dtype (also
per slot), which is charged here too so the pool never outgrows SGLang's memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import KVTunerError
from ...profile import Profile

__all__ = ["CellSize", "cell_size"]


@dataclass(frozen=True)
class CellSize:
    """Per-token bytes of one rank: packed K/V rows, and the dequant scratch."""

    packed: int
    scratch: int

    def __post_init__(self) -> None:
        if self.packed <= 0 or self.scratch < 0:
            raise KVTunerError(f"invalid cell size: packed={self.packed} scratch={self.scratch}")

    @property
    def total(self) -> int:
        return self.packed + self.scratch


def cell_size(
    profile: Profile, *, heads: int, start_layer: int, num_layers: int, dtype_bytes: int
) -> CellSize:
    """Bytes per token of layers ``[start_layer, start_layer + num_layers)`` with ``heads``
    KV heads on this rank (SGLang's TP split), scratch in a ``dtype_bytes`` dtype."""
    d = profile.fingerprint.head_dim
    if start_layer < 0 or start_layer + num_layers > len(profile.layers):
        raise KVTunerError(
            f"layers {start_layer}..{start_layer + num_layers - 1} are outside the profile's "
            f"{len(profile.layers)} layers"
        )
    layers = profile.layers[start_layer : start_layer + num_layers]
    packed = sum(heads * (s.k.row_bytes(d) + s.v.row_bytes(d)) for s in layers)
    return CellSize(packed=packed, scratch=heads * 2 * d * dtype_bytes)
