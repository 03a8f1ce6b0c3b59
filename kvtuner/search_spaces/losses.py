"""LossTable: the additive sensitivity model, KL of quantizing one layer's K or V alone.

``kl[layer, part, b]`` with part 0 = keys, 1 = values and ``b`` indexing :data:`BITS`
(2, 4, 8, 16); 16 bits cost nothing (0.0). The loss of a mixed configuration is modelled as the
sum over layers — a prior for pruning, clustering and the knapsack, never the final judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KVTunerError

__all__ = ["BITS", "LossTable"]

BITS = (2, 4, 8, 16)


@dataclass(frozen=True, eq=False)
class LossTable:
    """``kl``: float64 array [num_layers, 2, len(BITS)], finite and >= 0."""

    kl: np.ndarray

    def __post_init__(self) -> None:
        kl = np.asarray(self.kl, dtype=np.float64)
        if kl.ndim != 3 or kl.shape[1:] != (2, len(BITS)) or kl.shape[0] < 1:
            raise KVTunerError(f"loss table must be [layers, 2, {len(BITS)}], got {kl.shape}")
        if not np.isfinite(kl).all():
            raise KVTunerError("sensitivity has non-finite KL values")
        kl = np.maximum(kl, 0.0)  # tiny negative KL is float noise
        kl.setflags(write=False)
        object.__setattr__(self, "kl", kl)

    @property
    def num_layers(self) -> int:
        return self.kl.shape[0]

    @classmethod
    def from_sensitivity(cls, sensitivity: Any, num_layers: int) -> LossTable:
        """From anything with ``.kl(layer, "k"|"v", bits)`` (e.g. calibration.Sensitivity)."""
        try:
            rows = [
                [[float(sensitivity.kl(i, part, b)) for b in BITS] for part in ("k", "v")]
                for i in range(num_layers)
            ]
        except (KeyError, IndexError) as exc:
            raise KVTunerError(f"sensitivity does not cover {num_layers} layers: {exc}") from None
        return cls(np.array(rows))

    def loss(self, layer: int, k_bits: int, v_bits: int) -> float:
        return float(self.kl[layer, 0, BITS.index(k_bits)] + self.kl[layer, 1, BITS.index(v_bits)])

    def group_loss(self, layers: Sequence[int], k_bits: int, v_bits: int) -> float:
        return sum(self.loss(i, k_bits, v_bits) for i in layers)

    def features(self) -> np.ndarray:
        """[layers, 6] log10 KL at 2/4/8 bits for K then V: what layer clustering compares."""
        quantized = self.kl[:, :, : len(BITS) - 1].reshape(self.num_layers, -1)
        return np.log10(np.maximum(quantized, 1e-9))
