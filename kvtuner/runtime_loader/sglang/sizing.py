"""Bytes per token the kvtuner pool costs one rank: what SGLang divides its KV budget by.

Per layer the pool stores one packed K row and one packed V row per (token, KV head). In the
"scratch" read mode (backends that need a real tensor) the pool also keeps one layer-sized
dequantized K and V scratch in the model dtype (also per slot), charged here too so the pool never
outgrows SGLang's memory budget; the "lazy" read mode has no scratch: packed bytes only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import KVTunerError
from ...profile import Profile

__all__ = ["READ_MODES", "CellSize", "cell_size"]

READ_MODES = ("lazy", "scratch")  # how attention backends read the pool (see pool.py)


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
    profile: Profile,
    *,
    heads: int,
    start_layer: int,
    num_layers: int,
    dtype_bytes: int,
    read_mode: str = "scratch",
) -> CellSize:
    """Bytes per token of layers ``[start_layer, start_layer + num_layers)`` with ``heads``
    KV heads on this rank (SGLang's TP split); scratch in a ``dtype_bytes`` dtype when
    ``read_mode == "scratch"``, none when ``"lazy"``."""
    if read_mode not in READ_MODES:
        raise KVTunerError(f"read_mode must be one of {READ_MODES}, got {read_mode!r}")
    d = profile.fingerprint.head_dim
    if start_layer < 0 or start_layer + num_layers > len(profile.layers):
        raise KVTunerError(
            f"layers {start_layer}..{start_layer + num_layers - 1} are outside the profile's "
            f"{len(profile.layers)} layers"
        )
    layers = profile.layers[start_layer : start_layer + num_layers]
    packed = sum(heads * (s.k.row_bytes(d) + s.v.row_bytes(d)) for s in layers)
    scratch = heads * 2 * d * dtype_bytes if read_mode == "scratch" else 0
    return CellSize(packed=packed, scratch=scratch)
