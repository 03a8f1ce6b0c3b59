"""Bytes per token the kvtuner pool costs one rank: what SGLang divides its KV budget by.

Per layer the pool stores one packed K row and one packed V row per (token, KV head). In the
"scratch" read mode (backends that need a real tensor) the pool also keeps one layer-sized
dequantized K and V scratch in the model dtype (also per slot), charged here too so the pool never
outgrows SGLang's memory budget; the "lazy" and "packed" (the kvtuner attention backend) read
modes have no scratch: packed bytes only. Pre-RoPE keys add a 4-byte position per slot.

Channel-axis (KIVI) sides cost their block bytes amortized over the page's tokens, plus a fixed
fp staging area (:func:`staging_bytes`: one page per request that may be filling one), which
the plugin takes off SGLang's KV budget before it divides by the cell size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ....errors import KVTunerError
from ....profile import Profile
from ....profile.channel_sides import channel_sides, layer_slice
from .slot_rope import POSITION_BYTES

__all__ = [
    "LAZY_BACKENDS",
    "PACKED_BACKEND",
    "READ_MODES",
    "STAGE_MARGIN",
    "CellSize",
    "allocation_line",
    "cell_size",
    "read_mode",
    "stage_pages_for",
    "staging_bytes",
]

READ_MODES = ("lazy", "scratch", "packed")  # how attention backends read the pool (store.py)
# backends whose only pool reads are ``get_key_buffer(l)[slot_ids]`` / ``get_value_buffer(l)[...]``
# (sglang 0.5.23 layers/attention/torch_native_backend.py); anything else gets a real tensor
LAZY_BACKENDS = frozenset({"torch_native"})
PACKED_BACKEND = "kvtuner"  # the plugin's backend: fused kernels over the packed rows
# staged pages beyond one per running request: the padding page (dummy writes to slot 0), a
# chunked prefill's request, pages freed a step late under overlap scheduling
STAGE_MARGIN = 4


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
    """Per-token bytes of one rank: packed K/V rows, the dequant scratch, and the slot
    position table of pre-RoPE keys (:mod:`.slot_rope`)."""

    packed: int
    scratch: int
    positions: int = 0

    def __post_init__(self) -> None:
        if self.packed <= 0 or self.scratch < 0 or self.positions < 0:
            raise KVTunerError(
                f"invalid cell size: packed={self.packed} scratch={self.scratch} "
                f"positions={self.positions}"
            )

    @property
    def total(self) -> int:
        return self.packed + self.scratch + self.positions


def cell_size(
    profile: Profile,
    *,
    heads: int,
    start_layer: int,
    num_layers: int,
    dtype_bytes: int,
    read_mode: str = "scratch",
    layer_ids: Sequence[int] | None = None,
) -> CellSize:
    """Bytes per token of layers ``[start_layer, start_layer + num_layers)`` (or of the global
    ``layer_ids``: a sub-pool of SGLang's SWAKVPool) with ``heads`` KV heads on this rank
    (SGLang's TP split); scratch in a ``dtype_bytes`` dtype when ``read_mode == "scratch"``,
    none otherwise."""
    if read_mode not in READ_MODES:
        raise KVTunerError(f"read_mode must be one of {READ_MODES}, got {read_mode!r}")
    d = profile.fingerprint.head_dim
    if layer_ids is None:
        layers = layer_slice(profile, start_layer, num_layers)
    else:
        layers = [layer_slice(profile, i, 1)[0] for i in layer_ids]
    exact = sum(
        heads * (s.k.exact_bytes_per_token(d) + s.v.exact_bytes_per_token(d)) for s in layers
    )
    scratch = heads * 2 * d * dtype_bytes if read_mode == "scratch" else 0
    positions = POSITION_BYTES if any(s.k.pre_rope for s in layers) else 0
    return CellSize(packed=math.ceil(exact), scratch=scratch, positions=positions)


def staging_bytes(
    profile: Profile,
    *,
    heads: int,
    start_layer: int,
    num_layers: int,
    dtype_bytes: int,
    stage_pages: int,
) -> int:
    """Bytes of the fp staging area: ``stage_pages`` pages of ``group_size`` tokens per
    channel-axis side, ``heads`` x head_dim values each, in a ``dtype_bytes`` dtype."""
    d = profile.fingerprint.head_dim
    sides = channel_sides(profile, start_layer, num_layers)
    return stage_pages * sum(qs.group_size * heads * d * dtype_bytes for qs in sides)


def stage_pages_for(max_running_requests: int) -> int:
    """Filling pages the staging holds per channel-axis side: one per running request (each
    fills at most one page at a time) plus ``STAGE_MARGIN``."""
    return max_running_requests + STAGE_MARGIN


def allocation_line(pool: Any) -> str:
    """The start-up log line of a built kvtuner pool: its bytes, and the profile's prediction."""
    k, v = pool.get_kv_size_bytes()
    ids, layers = pool.layer_ids, pool.profile.layers
    predicted = cell_size(
        pool.profile,
        heads=pool.head_num,
        start_layer=pool.start_layer,
        num_layers=pool.layer_num,
        dtype_bytes=pool.dtype.itemsize,
        read_mode=pool.read_mode,
        layer_ids=ids,
    )
    sides = [qs for i in ids for qs in (layers[i].k, layers[i].v)]
    channel = sum(qs.axis == "channel" and qs.is_quantized for qs in sides)
    return (
        f"kvtuner pool: profile {pool.profile.hash}, layers {_layer_range(ids)} of "
        f"{len(layers)}, #tokens: {pool.size}, rows: {pool.size + pool.page_size}, packed KV "
        f"bytes: {k + v} (profile predicts {predicted.packed} B/token), read mode "
        f"{pool.read_mode}, dequant scratch bytes: {pool.scratch_bytes()}, decode cache: at most "
        f"{pool.decode_cache_tokens} tokens per layer ({pool.decode_cache_bound_bytes()} bytes), "
        f"fp staging: {pool.stage_pages} filling pages per channel-axis side ({channel} sides, "
        f"{pool.staging_bytes()} bytes)"
    )


def _layer_range(ids: Sequence[int]) -> str:
    """``15..29`` for contiguous ids, else the list (a SWAKVPool sub-pool's layers)."""
    ids = tuple(ids)
    if not ids:
        return "none"
    if ids == tuple(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ",".join(map(str, ids))
