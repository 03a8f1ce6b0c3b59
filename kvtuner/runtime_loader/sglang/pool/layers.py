"""PoolLayers: which of the model's layers a kvtuner pool holds, and the model facts their
parts are built from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....profile import LayerSpec

__all__ = ["PoolLayers"]


@dataclass(frozen=True)
class PoolLayers:
    """The pool's layers in local order: ``specs`` (each one's LayerSpec), held under SGLang's
    layer ids ``start_layer ..``; ``model_heads``: the model's KV heads on all ranks together;
    ``rope_freq``: the model's rotary frequencies (fp32 [R/2]) for pre-RoPE keys, or None."""

    specs: tuple[LayerSpec, ...]
    start_layer: int
    model_heads: int
    rope_freq: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.start_layer < 0 or self.model_heads <= 0:
            raise ValueError(
                f"invalid pool layers: start_layer={self.start_layer}, "
                f"model_heads={self.model_heads}"
            )

    def __len__(self) -> int:
        return len(self.specs)
