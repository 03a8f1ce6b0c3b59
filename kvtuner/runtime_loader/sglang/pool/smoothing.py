"""The pool's key smoothing (profile schema v3): keys are stored as ``k / λ``, read as rows × λ.

Writes divide the new keys by their layer's λ (fp32) before any quantizer runs (numpy writer,
torch reference or Triton kernel: all quantize the same fp32 input, so their bytes stay equal);
reads dequantize in fp32, multiply by λ and only then round to the model dtype, as the HF cache
does. The decode cache's values take the same road, so every read equals :meth:`read_kv`.
"""

from __future__ import annotations

import torch

from ....errors import KVTunerError
from ....quant.smoothing import smooth, unsmooth

__all__ = ["PoolSmoothing"]


class PoolSmoothing:
    """Mixin of :class:`KVTunerMHATokenToKVPool`: per local layer λ [heads, D] or None."""

    def _smoothing_factors(self) -> list[torch.Tensor | None]:
        specs = [self.layer_spec(self.start_layer + i) for i in range(self.layer_num)]
        if all(s.k_smooth is None for s in specs):
            return [None] * self.layer_num
        if self.head_num != self.profile.fingerprint.num_kv_heads:
            raise KVTunerError(
                f"key smoothing needs every KV head on one rank ({self.head_num} of "
                f"{self.profile.fingerprint.num_kv_heads} here): tensor parallelism with a "
                "smoothed profile is not supported yet"
            )
        return [None if s.k_smooth is None else s.k_smooth.tensor(self.device) for s in specs]

    def key_smoothing(self, layer_id: int) -> torch.Tensor | None:
        """fp32 λ [heads, D] of global layer ``layer_id`` (its packed keys hold k / λ), or None."""
        return self._lams[layer_id - self.start_layer]

    def _smoothed_keys(self, local: int, k: torch.Tensor) -> torch.Tensor:
        """K [n, heads, D] as stored: fp32 k / λ (k itself without smoothing)."""
        return smooth(k, self._lams[local], -2)

    def _values_dtype(self, local: int) -> torch.dtype:
        """What dequantized rows come out in before :meth:`_read_back`: fp32 when smoothed."""
        return self.dtype if self._lams[local] is None else torch.float32

    def _read_back(self, local: int, k: torch.Tensor | None, v: torch.Tensor | None):
        """Dequantized K, V (in :meth:`_values_dtype`) as attention reads them (model dtype)."""
        lam = self._lams[local]
        if lam is None or k is None:
            return k, v
        return unsmooth(k, lam, -2, self.dtype), None if v is None else v.to(self.dtype)
