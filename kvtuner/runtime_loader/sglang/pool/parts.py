"""PoolParts: the parts the kvtuner pool is built from, each a class that owns its state and is
handed what it needs when built (no part reads another's or the pool's private fields).

- :class:`StoredLayers`: the packed buffers of every layer, the grid K and V share, the
  channel-axis page stores (:class:`ChannelSides`) and key smoothing's λ (:class:`LayerLambdas`);
- :class:`SlotRope`: the slot positions of pre-RoPE keys (None without them);
- :class:`PackedReads`: the dequantization of a layer's slots (every read ends in it);
- :class:`ReadState`: the views, scratch, batch and decode caches reads are served from;
- :class:`PoolWriter`: quantizes and stores writes, and tells the read state what changed.

:func:`build_parts` wires them once, inside SGLang's ``_create_buffers``, from four objects:
the layers (:class:`PoolLayers`), the sizes (:class:`PoolGeometry`), the quantizer ops
(:class:`PoolOps`) and how reads are served (:class:`ReadPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ....quant.planes import layer_planes
from .channels import ChannelSides
from .geometry import PoolGeometry
from .layers import PoolLayers
from .lazy_reads.read_plan import ReadPlan
from .lazy_reads.read_state import ReadState
from .ops import PoolOps
from .reads import PackedReads
from .slot_rope import SlotRope
from .smoothing import LayerLambdas
from .stored_layers import StoredLayers
from .writes import PoolWriter, shared_grids

__all__ = ["PoolParts", "build_parts", "pool_planes"]


@dataclass(frozen=True)
class PoolParts:
    """The built parts (see the module doc); ``rope`` is None without pre-RoPE keys."""

    stored: StoredLayers
    rope: SlotRope | None
    packed: PackedReads
    reads: ReadState
    writer: PoolWriter


def pool_planes(layers: PoolLayers, geometry: PoolGeometry, ops: PoolOps) -> list:
    """Per local layer, whether its K and V rows are laid out as planes: where they give the
    Triton kernels 16-byte code copies (:func:`~kvtuner.quant.planes.layer_planes`); never on
    the CPU torch path (its numpy writer and pair codec write rows)."""
    no = (False, False)
    dim, heads = geometry.head_dim, geometry.heads
    return [no if ops.torch_cpu else layer_planes(s.k, s.v, dim, heads) for s in layers.specs]


def build_parts(
    layers: PoolLayers, geometry: PoolGeometry, ops: PoolOps, plan: ReadPlan
) -> PoolParts:
    """The parts of a pool of ``layers`` (``geometry.heads`` of their ``model_heads`` KV heads
    on this rank); the caches and the writer read through ``plan``'s reads by layer id, so
    what they serve is what the pool reads."""
    lambdas = LayerLambdas.for_layers(layers, geometry)  # refuses before any allocation
    rope = SlotRope.for_layers(layers.specs, geometry.rows, geometry.device, layers.rope_freq)
    k_buffer, v_buffer, channels = ChannelSides.allocate(
        layers.specs, geometry, rope=rope, packer=ops.packer
    )
    stored = StoredLayers(
        layers,
        k_buffer,
        v_buffer,
        pairs=shared_grids(layers.specs, ops.torch_cpu),
        channels=channels,
        lambdas=lambdas,
        planes=pool_planes(layers, geometry, ops),
    )
    reads = ReadState(plan, geometry)
    writer = PoolWriter(stored, geometry, ops, reads)
    return PoolParts(stored, rope, PackedReads(stored, geometry, ops), reads, writer)
