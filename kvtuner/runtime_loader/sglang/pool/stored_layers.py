"""StoredLayers: the kvtuner pool's layers as they are stored, the one object the pool's writer
and its dequantization (:class:`PoolWriter`, :class:`PackedReads`) share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ....profile import LayerSpec
from ....quant import QuantSpec
from .channels import ChannelSides
from .layers import PoolLayers
from .smoothing import LayerLambdas

__all__ = ["StoredLayers"]


@dataclass(frozen=True)
class StoredLayers:
    """Per local layer of ``layers``: the packed ``k_buffer``/``v_buffer`` (SGLang's per-layer
    lists, uint8 ``[rows, heads, row_bytes]`` or a channel-axis side's page blocks), ``pairs``
    (the grid K and V share, None: quantized apart), ``channels`` (the channel-axis page
    stores), ``lambdas`` (key smoothing λ) and ``planes`` (whether K's and V's rows are laid
    out as planes, :mod:`kvtuner.quant.planes`)."""

    layers: PoolLayers
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]
    pairs: Sequence[QuantSpec | None]
    channels: ChannelSides
    lambdas: LayerLambdas
    planes: Sequence[tuple[bool, bool]]

    def __post_init__(self) -> None:
        per_layer = (self.k_buffer, self.v_buffer, self.pairs, self.channels, self.lambdas,
                     self.planes)  # fmt: skip
        sizes = {len(part) for part in per_layer}
        if sizes != {len(self.layers)}:
            raise ValueError(f"{len(self.layers)} pool layers stored in parts of sizes {sizes}")

    @property
    def specs(self) -> tuple[LayerSpec, ...]:
        """Each local layer's LayerSpec."""
        return self.layers.specs

    def in_planes(self, local: int, which: str) -> bool:
        """Whether local layer ``local``'s K (``which="k"``) or V rows are planes."""
        return self.planes[local][which == "v"]

    @property
    def start_layer(self) -> int:
        """SGLang's layer id of local layer 0."""
        return self.layers.start_layer
