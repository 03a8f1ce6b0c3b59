"""LossTable: the additive sensitivity model, KL of quantizing one layer's K or V alone.

``kl[layer, part, b]`` with part 0 = keys, 1 = values and ``b`` indexing the table's ``bits``
(the widths calibration measured, then 16); 16 bits cost nothing (0.0). The loss of a mixed
configuration is modelled as the sum over layers — a prior for pruning, clustering and the
knapsack, never the final judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KVTunerError

__all__ = ["BITS", "DEFAULT_BITS", "LossTable"]

# Widths calibration measures and the search chooses from by default. 3 and 5 bits (format v2)
# matter on SmolLM2: uniform KIVI K3V3 has 0.43x the KL of K4V2 at the same 3 nominal bits.
DEFAULT_BITS = (2, 3, 4, 5, 8)
BITS = (*DEFAULT_BITS, 16)  # a default table's columns


@dataclass(frozen=True, eq=False)
class LossTable:
    """``kl``: float64 array [num_layers, 2, len(bits)], finite and >= 0; ``bits`` ascending
    quantized widths followed by 16."""

    kl: np.ndarray
    bits: tuple[int, ...] = BITS

    def __post_init__(self) -> None:
        bits = tuple(self.bits)
        if bits != tuple(sorted(set(bits))) or bits[-1:] != (16,) or len(bits) < 2:
            raise KVTunerError(f"loss table bits must ascend and end with 16, got {bits}")
        object.__setattr__(self, "bits", bits)
        kl = np.asarray(self.kl, dtype=np.float64)
        if kl.ndim != 3 or kl.shape[1:] != (2, len(bits)) or kl.shape[0] < 1:
            raise KVTunerError(f"loss table must be [layers, 2, {len(bits)}], got {kl.shape}")
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
        """From anything with ``.bits`` and ``.kl(layer, "k"|"v", bits)`` (e.g.
        calibration.Sensitivity); the table's bits are the measured ones plus 16."""
        bits = (*sorted(set(sensitivity.bits) - {16}), 16)
        try:
            rows = [
                [[float(sensitivity.kl(i, part, b)) for b in bits] for part in ("k", "v")]
                for i in range(num_layers)
            ]
        except (KeyError, IndexError) as exc:
            raise KVTunerError(f"sensitivity does not cover {num_layers} layers: {exc}") from None
        return cls(np.array(rows), bits)

    def column(self, bits: int) -> int:
        """Index of ``bits`` along the table's last axis."""
        return self.bits.index(bits)

    def loss(self, layer: int, k_bits: int, v_bits: int) -> float:
        return float(
            self.kl[layer, 0, self.column(k_bits)] + self.kl[layer, 1, self.column(v_bits)]
        )

    def group_loss(self, layers: Sequence[int], k_bits: int, v_bits: int) -> float:
        return sum(self.loss(i, k_bits, v_bits) for i in layers)

    def features(self) -> np.ndarray:
        """[layers, 2 * quantized widths] log10 KL for K then V: what layer clustering compares."""
        quantized = self.kl[:, :, :-1].reshape(self.num_layers, -1)
        return np.log10(np.maximum(quantized, 1e-9))
