"""PoolParts: the parts the kvtuner pool is built from, each a class that owns its state and is
handed what it needs when built (no part reads another's or the pool's private fields).

- :class:`ChannelSides`: the packed buffers of every layer and the channel-axis page stores;
- :class:`KeySmoothing`: λ per layer (keys stored as k / λ);
- :class:`SlotRope`: the slot positions of pre-RoPE keys (None without them);
- :class:`PackedReads`: the dequantization of a layer's slots (every read ends in it);
- :class:`ReadState`: the views, scratch, batch and decode caches reads are served from;
- :class:`PoolWriter`: quantizes and stores writes, and tells the read state what changed.

:func:`build_parts` wires them once, inside SGLang's ``_create_buffers``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ....profile import LayerSpec
from ....quant import QuantSpec
from .channels import ChannelSides, PoolGeometry
from .lazy_reads.batch_reads import ReadKV
from .lazy_reads.decode_cache import DecodeCache
from .lazy_reads.read_state import ReadOne, ReadState
from .lazy_reads.view import DequantizedView
from .reads import Gather, PackedReads
from .slot_rope import SlotRope
from .smoothing import KeySmoothing
from .writes import PoolWriter, Scatter, shared_grids

__all__ = ["PoolOps", "PoolParts", "build_parts"]


@dataclass(frozen=True)
class PoolOps:
    """The quantizer ops: token-axis ``scatter``/``gather`` and the channel-axis page
    ``packer``; ``torch_cpu``: they are the torch reference on CPU (numpy writer, pair codec)."""

    scatter: Scatter
    gather: Gather
    packer: Callable[..., None]
    torch_cpu: bool


@dataclass(frozen=True)
class PoolParts:
    """The built parts; ``k_buffer``/``v_buffer`` are SGLang's per-layer buffer lists and
    ``pairs`` the grid K and V share per local layer (None: quantized apart)."""

    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]
    pairs: list[QuantSpec | None]
    channels: ChannelSides
    smoothing: KeySmoothing
    rope: SlotRope | None
    packed: PackedReads
    reads: ReadState
    writer: PoolWriter


def build_parts(
    specs: Sequence[LayerSpec],
    geometry: PoolGeometry,
    *,
    read_mode: str,
    start_layer: int,
    model_heads: int,
    stage_pages: int,
    decode_cache_tokens: int,
    rope_freq: torch.Tensor | None,
    ops: PoolOps,
    views: Mapping[int, tuple[DequantizedView, DequantizedView]],
    read_kv: ReadKV,
    read_one: ReadOne,
) -> PoolParts:
    """The parts of a pool of layers ``specs`` (local order, from ``start_layer``) holding
    ``model_heads`` KV heads in all (``geometry.heads`` on this rank). ``views``: the lazy
    mode's per-layer views; ``read_kv``/``read_one``: the pool's reads by layer id, which the
    caches and the writer call (so what they serve is what the pool reads)."""
    g = geometry
    smoothing = KeySmoothing.for_layers(
        specs, heads=g.heads, model_heads=model_heads, dtype=g.dtype, device=g.device
    )
    rope = SlotRope.for_layers(specs, g.rows, g.device, rope_freq)
    pairs = shared_grids(specs, ops.torch_cpu)
    k_buffer, v_buffer, channels = ChannelSides.allocate(
        specs, g, stage_pages=stage_pages, rope=rope, packer=ops.packer
    )
    scratch = None
    if read_mode == "scratch":  # [rows, heads, head_dim] in the model dtype, as backends expect
        shape = (g.rows, g.heads, g.head_dim)
        scratch = tuple(torch.zeros(shape, dtype=g.dtype, device=g.device) for _ in "kv")
    common = dict(specs=specs, pairs=pairs, channels=channels, smoothing=smoothing)
    packed = PackedReads(
        k_buffer, v_buffer, **common, gather=ops.gather, head_dim=g.head_dim, dtype=g.dtype
    )
    cache = DecodeCache(decode_cache_tokens, g.rows, g.device)
    reads = ReadState(
        read_mode, views=views, scratch=scratch, cache=cache, read_kv=read_kv, read_one=read_one
    )
    writer = PoolWriter(
        k_buffer,
        v_buffer,
        **common,
        start_layer=start_layer,
        reads=reads,
        read_kv=read_kv,
        scatter=ops.scatter,
        torch_cpu=ops.torch_cpu,
        page_size=g.page,
        heads=g.heads,
        head_dim=g.head_dim,
    )
    return PoolParts(k_buffer, v_buffer, pairs, channels, smoothing, rope, packed, reads, writer)
