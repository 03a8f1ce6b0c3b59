"""Bytes per token the kvtuner pool costs one rank: what SGLang divides its KV budget by.

Per layer the pool stores one packed K row and one packed V row per (token, KV head). In the
"scratch" read mode (backends that need a real tensor) the pool also keeps one layer-sized
dequantized K and V scratch in the model dtype (also per slot), charged here too so the pool never
outgrows SGLang's memory budget; the "lazy" and "packed" (the kvtuner attention backend) read
modes have no scratch: packed bytes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import KVTunerError
from ...profile import Profile

__all__ = ["LAZY_BACKENDS", "PACKED_BACKEND", "READ_MODES", "CellSize", "cell_size", "read_mode"]

READ_MODES = ("lazy", "scratch", "packed")  # how attention backends read the pool (pool.py)
# backends whose only pool reads are ``get_key_buffer(l)[slot_ids]`` / ``get_value_buffer(l)[...]``
# (sglang 0.5.23 layers/attention/torch_native_backend.py); anything else gets a real tensor
LAZY_BACKENDS = frozenset({"torch_native"})
PACKED_BACKEND = "kvtuner"  # the plugin's backend: fused kernels over the packed rows


def read_mode(server_args: Any) -> str:
    """ "packed" if the prefill and decode attention backends are both kvtuner's, "lazy" if both
    read by slot ids only, else "scratch" (also for an unset/unknown backend)."""
    default = getattr(server_args, "attention_backend", None)
    backends = {
        getattr(server_args, "prefill_attention_backend", None) or default,
        getattr(server_args, "decode_attention_backend", None) or default,
    }
    if backends == {PACKED_BACKEND}:
        return "packed"
    return "lazy" if backends <= LAZY_BACKENDS else "scratch"


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
    ``read_mode == "scratch"``, none otherwise."""
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
