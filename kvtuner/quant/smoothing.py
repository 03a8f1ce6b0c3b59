"""KeySmoothing: calibrated per-channel factors λ that divide keys before per-token quantization.

The SmoothAttention idea (QServe): a few key channels carry most of the magnitude, so a per-token
group's scale is set by them and the other channels get few codes. Dividing each channel by
``λ[head, channel]`` (calibrated, e.g. ``max|k|^α``) flattens the row before quantizing; reads
multiply back (or the query is multiplied by λ: ``q·k = (q ⊙ λ)·(k / λ)``), so attention is
unchanged but for the quantization error.

Format: the stored row is ``quantize(fp32(x) / λ)`` (IEEE division, before any Hadamard
rotation); the read is ``dequantize(row) (fp32) * λ``, then cast to the model dtype. λ is
fp16-representable, finite and positive; one ``[heads, head_dim]`` table per layer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["KeySmoothing", "smooth", "unsmooth"]


def _fp16_exact(value: float) -> bool:
    return float(torch.tensor(value, dtype=torch.float32).half().float()) == value


@dataclass(frozen=True)
class KeySmoothing:
    """λ ``[heads][head_dim]``: fp16-representable, finite, positive numbers."""

    factors: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        rows = self.factors
        if not isinstance(rows, (tuple, list)) or not rows:
            raise ValueError("smoothing factors must be a non-empty [heads][head_dim] list")
        rows = tuple(tuple(r) if isinstance(r, (tuple, list)) else r for r in rows)
        if any(not isinstance(r, tuple) for r in rows) or len({len(r) for r in rows}) != 1:
            raise ValueError("smoothing factors must be a rectangular [heads][head_dim] list")
        for h, row in enumerate(rows):
            for c, x in enumerate(row):
                ok = isinstance(x, (int, float)) and not isinstance(x, bool)
                if not ok or not math.isfinite(x) or x <= 0 or not _fp16_exact(float(x)):
                    raise ValueError(
                        f"smoothing factor [{h}][{c}] = {x!r}: must be a finite positive "
                        "fp16-representable number"
                    )
        object.__setattr__(self, "factors", tuple(tuple(float(x) for x in r) for r in rows))

    @property
    def heads(self) -> int:
        return len(self.factors)

    @property
    def head_dim(self) -> int:
        return len(self.factors[0])

    def check_shape(self, heads: int, head_dim: int) -> None:
        if (self.heads, self.head_dim) != (heads, head_dim):
            raise ValueError(
                f"smoothing factors are [{self.heads}, {self.head_dim}], the model's keys "
                f"[{heads}, {head_dim}]"
            )

    def tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """fp32 [heads, head_dim] on ``device`` (one copy per device)."""
        return _factors_on(self.factors, str(torch.device(device)))

    def to_list(self) -> list[list[float]]:
        return [list(r) for r in self.factors]

    @classmethod
    def from_magnitudes(cls, magnitude: torch.Tensor, alpha: float) -> KeySmoothing:
        """λ = magnitude^α per [head, channel], scaled to geometric mean 1 per head (so the
        smoothed keys keep their overall size), rounded to fp16."""
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        lam = magnitude.float().clamp_min(1e-3).pow(alpha)
        lam = lam / lam.log().mean(-1, keepdim=True).exp()
        lam = lam.clamp(2.0**-14, 2.0**15).half().float()  # normal fp16, far from overflow
        return cls(tuple(tuple(r) for r in lam.tolist()))

    @classmethod
    def from_list(cls, data: Sequence[Sequence[float]]) -> KeySmoothing:
        return cls(tuple(data))  # __post_init__ checks and converts the rows


@functools.lru_cache(maxsize=256)
def _factors_on(factors: tuple[tuple[float, ...], ...], device: str) -> torch.Tensor:
    with torch.inference_mode(False):  # cached: never an inference tensor
        return torch.tensor(factors, dtype=torch.float32, device=device)


def _broadcast(lam: torch.Tensor, head_axis: int) -> torch.Tensor:
    """λ [H, D] viewed to broadcast against a tensor with heads on ``head_axis`` (negative)."""
    return lam.view(lam.shape[0], *([1] * (-head_axis - 2)), lam.shape[1])


def smooth(x: torch.Tensor, lam: torch.Tensor | None, head_axis: int) -> torch.Tensor:
    """fp32 x / λ (x with heads on ``head_axis``, e.g. -3 for [B, H, T, D], -2 for [N, H, D]);
    x itself when λ is None."""
    if lam is None:
        return x
    return x.float() / _broadcast(lam, head_axis)


def unsmooth(
    y: torch.Tensor, lam: torch.Tensor | None, head_axis: int, dtype: torch.dtype
) -> torch.Tensor:
    """(fp32 y * λ) in ``dtype``: the read side of :func:`smooth`."""
    if lam is None:
        return y.to(dtype)
    return (y.float() * _broadcast(lam, head_axis)).to(dtype)
