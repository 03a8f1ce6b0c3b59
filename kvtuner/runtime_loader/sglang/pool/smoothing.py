"""LayerLambdas: the pool's key smoothing (profile schema v3), the λ of each layer as device
tensors: keys are stored as ``k / λ``, read as rows × λ. (The profile's λ values themselves are
:class:`kvtuner.quant.smoothing.KeySmoothing`, one per smoothed LayerSpec.)

Writes divide the new keys by their layer's λ (fp32) before any quantizer runs (numpy writer,
torch reference or Triton kernel: all quantize the same fp32 input, so their bytes stay equal);
reads dequantize in fp32, multiply by λ and only then round to the model dtype, as the HF cache
does. The decode cache's values take the same road, so every read equals the pool's ``read_kv``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ....errors import KVTunerError
from ....quant.smoothing import smooth, unsmooth
from .geometry import PoolGeometry
from .layers import PoolLayers

__all__ = ["LayerLambdas"]


class LayerLambdas:
    """Per local layer λ (fp32 [heads, D], or None: not smoothed) and the model ``dtype``
    reads round to."""

    def __init__(self, lams: Sequence[torch.Tensor | None], dtype: torch.dtype) -> None:
        self._lams = list(lams)
        self._dtype = dtype

    @classmethod
    def for_layers(cls, layers: PoolLayers, geometry: PoolGeometry) -> LayerLambdas:
        """The λ of the pool's ``layers`` on ``geometry.device``; ``geometry.heads`` of the
        model's ``layers.model_heads`` KV heads are on this rank (smoothing needs all of them)."""
        specs, dtype = layers.specs, geometry.dtype
        if all(s.k_smooth is None for s in specs):
            return cls([None] * len(specs), dtype)
        if geometry.heads != layers.model_heads:
            raise KVTunerError(
                f"key smoothing needs every KV head on one rank ({geometry.heads} of "
                f"{layers.model_heads} here): tensor parallelism with a smoothed profile is not "
                "supported yet"
            )
        lams = [None if s.k_smooth is None else s.k_smooth.tensor(geometry.device) for s in specs]
        return cls(lams, dtype)

    def __len__(self) -> int:
        return len(self._lams)

    def factor(self, local: int) -> torch.Tensor | None:
        """fp32 λ [heads, D] of local layer ``local`` (its packed keys hold k / λ), or None."""
        return self._lams[local]

    def smoothed_keys(self, local: int, k: torch.Tensor) -> torch.Tensor:
        """K [n, heads, D] as stored: fp32 k / λ (k itself without smoothing)."""
        return smooth(k, self._lams[local], -2)

    def values_dtype(self, local: int) -> torch.dtype:
        """What dequantized rows come out in before :meth:`read_back`: fp32 when smoothed."""
        return self._dtype if self._lams[local] is None else torch.float32

    def read_back(self, local: int, k: torch.Tensor | None, v: torch.Tensor | None):
        """Dequantized K, V (in :meth:`values_dtype`) as attention reads them (model dtype)."""
        lam = self._lams[local]
        if lam is None or k is None:
            return k, v
        return unsmooth(k, lam, -2, self._dtype), None if v is None else v.to(self._dtype)
