"""Pool-facing quantizer ops: quantize-and-scatter into slots, gather-and-dequantize from slots,
pack full channel-axis pages.

A paged KV pool stores one packed row per (slot, head): ``buffer: uint8[num_slots, heads, R]``
with ``R = spec.row_bytes(head_dim)``; with ``planes`` each slot's same bytes hold every head's
codes, then every head's scales and zeros (:mod:`.planes`). CUDA tensors take the Triton
kernels; CPU tensors take the torch reference (the kernels are tested against it under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from .planes import from_planes, to_planes
from .reference import dequantize, quantize
from .spec import QuantSpec


def _check_pool_args(buffer: torch.Tensor, loc: torch.Tensor, spec: QuantSpec, head_dim: int):
    if spec.axis != "token":
        raise ValueError("a slot pool stores token-axis specs only")
    if buffer.dtype != torch.uint8 or buffer.dim() != 3:
        raise ValueError(
            f"buffer must be uint8 [slots, heads, row_bytes], got {buffer.dtype} "
            f"{tuple(buffer.shape)}"
        )
    if buffer.shape[-1] != spec.row_bytes(head_dim):
        raise ValueError(
            f"buffer rows have {buffer.shape[-1]} bytes, spec expects {spec.row_bytes(head_dim)}"
        )
    if loc.dim() != 1 or loc.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"loc must be 1-D int32/int64, got {loc.dtype} {tuple(loc.shape)}")


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda


def scatter_quantized(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    planes: bool = False,
) -> None:
    """``buffer[loc] = quantize(x)`` for x[N, heads, D] (as planes: ``to_planes(quantize(x))``);
    touches only the slots in ``loc``."""
    _check_pool_args(buffer, loc, spec, x.shape[-1])
    if x.dim() != 3 or x.shape[0] != loc.shape[0] or x.shape[1] != buffer.shape[1]:
        raise ValueError(
            f"x must be [len(loc)={loc.shape[0]}, heads={buffer.shape[1]}, D], got {tuple(x.shape)}"
        )
    if _use_triton(buffer):
        from .triton_kernels import triton_scatter_quantized

        triton_scatter_quantized(buffer, loc, x, spec, planes=planes)
        return
    rows = quantize(x, spec)
    buffer[loc.long()] = to_planes(rows, spec, x.shape[-1]) if planes else rows


def scatter_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    *,
    planes: tuple[bool, bool] = (False, False),
) -> None:
    """:func:`scatter_quantized` of K into ``k_buffer`` and of V into ``v_buffer`` at the same
    slots; CUDA: one Triton launch for both where both are quantized (a decode step's write)."""
    if not _use_triton(k_buffer):
        scatter_quantized(k_buffer, loc, k, k_spec, planes=planes[0])
        scatter_quantized(v_buffer, loc, v, v_spec, planes=planes[1])
        return
    for buffer, x, spec in ((k_buffer, k, k_spec), (v_buffer, v, v_spec)):
        _check_pool_args(buffer, loc, spec, x.shape[-1])
    from .triton_kernels import triton_scatter_kv

    triton_scatter_kv(k_buffer, v_buffer, loc, k, v, k_spec, v_spec, planes=planes)


def gather_dequantized(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    spec: QuantSpec,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    *,
    planes: bool = False,
) -> torch.Tensor:
    """``dequantize(buffer[loc])`` -> [N, heads, head_dim] in ``dtype`` (as planes:
    ``dequantize(from_planes(buffer[loc]))``)."""
    _check_pool_args(buffer, loc, spec, head_dim)
    if _use_triton(buffer):
        from .triton_kernels import triton_gather_dequantized

        return triton_gather_dequantized(buffer, loc, spec, head_dim, dtype, planes=planes)
    rows = buffer[loc.long()]
    rows = from_planes(rows, spec, head_dim) if planes else rows
    return dequantize(rows, spec, head_dim, dtype)


def quantize_rows(x: torch.Tensor, spec: QuantSpec, *, kernel: bool | None = None) -> torch.Tensor:
    """``quantize(x, spec)`` (the same bytes) for token rows x[..., D]; channel-axis specs go
    to :func:`quantize`. ``kernel`` (default: x on CUDA) runs the Triton kernel, one launch
    instead of the reference's dozen ops (CPU tensors need ``TRITON_INTERPRET=1``)."""
    if not (x.is_cuda if kernel is None else kernel) or spec.axis != "token":
        return quantize(x, spec)
    from .triton_kernels import triton_scatter_quantized

    flat = x.reshape(-1, 1, x.shape[-1])  # every token-head row its own slot
    rows = torch.empty(*flat.shape[:2], spec.row_bytes(x.shape[-1]), dtype=torch.uint8,
                       device=x.device)  # fmt: skip
    loc = torch.arange(flat.shape[0], device=x.device)
    triton_scatter_quantized(rows, loc, flat, spec)
    return rows.view(*x.shape[:-1], rows.shape[-1])


def pack_channel_pages(
    blocks: torch.Tensor, pages: torch.Tensor, x: torch.Tensor, spec: QuantSpec
) -> None:
    """``blocks[pages] = quantize(x.transpose(1, 2), spec).squeeze(2)``: full pages x
    [P, G, heads, D] of a channel-axis spec into ``blocks: uint8[pages, heads, block_bytes]``
    (the pool's KIVI pages). CUDA: one Triton launch."""
    if _use_triton(blocks):
        from .triton_channel import triton_pack_channel_pages

        triton_pack_channel_pages(blocks, pages, x, spec)
        return
    blocks[pages.long()] = quantize(x.transpose(1, 2), spec).squeeze(2)
