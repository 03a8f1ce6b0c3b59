"""K/V pair codec: one layer's K and V quantized (or dequantized) in ONE reference call when their
specs share a grid (bits, group size, symmetry; rotation may differ), for the CPU pool.

Why: on CPU the pool's cost per decode step is dominated by the number of small torch ops, not
by bytes; a layer whose K and V share a grid (every uniform profile, e.g. KV4 with rotated keys)
pays the op sequence once instead of twice. The bytes and values are exactly those of
``quantize``/``dequantize`` per tensor: the rotation is applied to K alone, outside the shared
call, and every grid op works per group.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .....quant import QuantSpec, dequantize, quantize
from .....quant.reference import quantize_dequantize, rotate

__all__ = ["dequantize_pair", "pair_spec", "quantize_pair", "quantize_pair_values"]


def pair_spec(k: QuantSpec, v: QuantSpec) -> QuantSpec | None:
    """The shared unrotated spec of K and V, or None when their grids differ (or 16 bits)."""
    plain_k, plain_v = replace(k, rotation="none"), replace(v, rotation="none")
    if plain_k != plain_v or not plain_k.is_quantized or plain_k.axis != "token":
        return None
    return plain_k


def quantize_pair(
    k: torch.Tensor, v: torch.Tensor, k_spec: QuantSpec, v_spec: QuantSpec, shared: QuantSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [n, heads, D] -> packed rows uint8 [n, heads, R] each, equal to quantize(k, k_spec)
    and quantize(v, v_spec)."""
    heads = k.shape[1]
    both = torch.cat([rotate(k, k_spec), rotate(v, v_spec)], 1)  # fp32 [n, 2*heads, D]
    rows = quantize(both, shared)
    return rows[:, :heads], rows[:, heads:]


def quantize_pair_values(
    k: torch.Tensor,
    v: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    shared: QuantSpec,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_pair` plus what :func:`dequantize_pair` returns for those rows (K, V
    [n, heads, D] in ``dtype``), from the codes in hand (``quantize_dequantize``)."""
    heads = k.shape[1]
    both = torch.cat([rotate(k, k_spec), rotate(v, v_spec)], 1)  # fp32 [n, 2*heads, D]
    rows, grid = quantize_dequantize(both, shared)  # grid: fp32, still rotated for K
    k_hat, v_hat = (
        _unrotate(grid[:, :heads], k_spec, dtype),
        _unrotate(grid[:, heads:], v_spec, dtype),
    )
    return rows[:, :heads], rows[:, heads:], k_hat, v_hat


def dequantize_pair(
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    shared: QuantSpec,
    head_dim: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows [n, heads, R] -> K, V [n, heads, head_dim] in ``dtype``, equal to
    dequantize(k_rows, k_spec) and dequantize(v_rows, v_spec)."""
    heads = k_rows.shape[1]
    both = dequantize(torch.cat([k_rows, v_rows], 1), shared, head_dim)  # fp32, unrotated
    return _unrotate(both[:, :heads], k_spec, dtype), _unrotate(both[:, heads:], v_spec, dtype)


def _unrotate(x: torch.Tensor, spec: QuantSpec, dtype: torch.dtype) -> torch.Tensor:
    if spec.rotation != "none":  # contiguous: the matmul sees dequantize's [n, heads, D] layout
        x = rotate(x.contiguous(), spec)
    return x.to(dtype)
