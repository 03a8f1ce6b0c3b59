"""Triton kernel for channel-axis (KIVI) blocks, beside its launcher: the pool's page packing.

``triton_pack_channel_pages``: ``blocks[pages] = quantize(x, spec)`` for x ``[P, G, heads, D]``
(P full pages of G tokens, G = the spec's group size), one program per (page, head). The
program holds the page's [G, D] tile, takes each channel's min/max (or absmax) over the G tokens,
and writes the format's channel-axis block: G code rows of the token-axis bit stream
(``store_codes``), then D fp16 scales, then D fp16 zeros. The bytes equal :mod:`.reference`
exactly, with the same rules as :mod:`.triton_kernels` (an IEEE ``1 / scale`` a group, no FMA
contraction, half-up rounding, directed fp16 metadata, a non-finite value poisons its channel: NaN
metadata, zero codes). The Hadamard rotation (``rotation="hadamard"``) is fp32 butterflies on the
tile (:func:`.triton_codes.hadamard_tile`).

Importing this module imports triton: set ``TRITON_INTERPRET=1`` before that to run it on CPU
tensors (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .intmath import next_power_of_2
from .spec import QuantSpec
from .triton_codes import grid_codes, hadamard_tile, store_codes, store_fp16
from .triton_kernels import interpreted, triton_version

__all__ = ["triton_pack_channel_pages"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _pack_kernel(
    x_ptr, pages_ptr, blk_ptr, heads, stride_xp, stride_xt, stride_xh, stride_bp,
    stride_bh, D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, SYMMETRIC: tl.constexpr,
    NW_PAD: tl.constexpr, ROTATE: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    page, head = pid // heads, pid % heads
    NW: tl.constexpr = D // 8
    NB: tl.constexpr = NW * BITS  # code bytes of one token row
    t = tl.arange(0, G)
    w = tl.arange(0, NW_PAD)
    e = w[:, None] * 8 + tl.arange(0, 8)[None, :]  # [NW_PAD, 8] channel index
    src = x_ptr + page.to(tl.int64) * stride_xp + head.to(tl.int64) * stride_xh
    if ROTATE:
        mask = (t[:, None, None] >= 0) & (e < D)[None]
        x = tl.load(src + t[:, None, None] * stride_xt + e[None], mask=mask, other=0.0)
        x = hadamard_tile(x.to(tl.float32), D)  # [G, NW_PAD, 8]
    else:  # channels in fours across the warp, a channel's G tokens in one thread
        c = tl.arange(0, 2 * NW_PAD)[:, None] * 4 + tl.arange(0, 4)[None, :]  # [2·NW_PAD, 4]
        mask = (t[:, None, None] >= 0) & (c < D)[None]
        x = tl.load(src + t[:, None, None] * stride_xt + c[None], mask=mask, other=0.0)
        x = tl.reshape(x.to(tl.float32), [G, NW_PAD, 8])
    q, scale, zero, ok = grid_codes(x, 0, BITS, SYMMETRIC)  # scale, zero, ok: [NW_PAD, 8]
    slot = tl.load(pages_ptr + page).to(tl.int64)
    dst = blk_ptr + slot * stride_bp + head.to(tl.int64) * stride_bh
    meta = dst + G * NB + 2 * e  # [NW_PAD, 8] fp16 scale slots, zeros 2·D bytes on
    meta_ok = e < D
    if not SYMMETRIC:
        store_fp16(meta + 2 * D, zero, ok, meta_ok, HALVES)
    store_fp16(meta, scale, ok, meta_ok, HALVES)
    q = q.to(tl.int32)
    store_codes(dst + t.to(tl.int64) * NB, q, t >= 0, NB, BITS)


def _check(blocks: torch.Tensor, pages: torch.Tensor, x: torch.Tensor, spec: QuantSpec) -> None:
    if not isinstance(spec, QuantSpec) or spec.axis != "channel" or not spec.is_quantized:
        raise ValueError(f"the channel kernel takes a quantized channel-axis spec, got {spec!r}")
    if x.dim() != 4 or x.dtype not in _FLOATS or x.shape[1] != spec.group_size:
        raise ValueError(
            f"x must be fp16/bf16/fp32 [pages, G={spec.group_size}, heads, D], got {x.dtype} "
            f"{tuple(x.shape)}"
        )
    d = x.shape[3]
    spec.check_head_dim(d)
    if blocks.dtype != torch.uint8 or blocks.dim() != 3 or blocks.stride(2) != 1:
        raise ValueError(
            f"blocks must be uint8 [pages, heads, block_bytes] with contiguous blocks, got "
            f"{blocks.dtype} {tuple(blocks.shape)} strides {blocks.stride()}"
        )
    if blocks.shape[1:] != (x.shape[2], spec.block_bytes(d)):
        raise ValueError(
            f"blocks must be [pages, {x.shape[2]}, {spec.block_bytes(d)}] for {spec.short()} at "
            f"head_dim {d}, got {tuple(blocks.shape)}"
        )
    if pages.dim() != 1 or pages.dtype not in (torch.int32, torch.int64) or len(pages) != len(x):
        raise ValueError(f"pages must be int32/int64 [{len(x)}], got {pages.dtype} {pages.shape}")
    if len({blocks.device, pages.device, x.device}) != 1:
        raise ValueError("blocks, pages and x must be on one device")
    if not blocks.is_cuda and not interpreted():
        raise ValueError(
            "Triton kernels need CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 before "
            "triton is first imported in this process"
        )


def triton_pack_channel_pages(
    blocks: torch.Tensor, pages: torch.Tensor, x: torch.Tensor, spec: QuantSpec
) -> None:
    """``blocks[pages] = quantize(x.transpose(1, 2), spec).squeeze(2)``: x [P, G, heads, D]
    (any strides but a contiguous last dim; a copy otherwise), one launch of P·heads programs;
    other pages stay untouched."""
    _check(blocks, pages, x, spec)
    if len(pages) == 0:
        return
    if x.stride(3) != 1:
        x = x.contiguous()
    launch_pack(blocks, pages, x, spec)


def launch_pack(blocks: torch.Tensor, pages: torch.Tensor, x: torch.Tensor, spec: QuantSpec):
    """The kernel's launch for checked arguments (x's last dim contiguous)."""
    d, rotate = x.shape[3], spec.rotation == "hadamard"
    grid = (x.shape[0] * x.shape[2],)
    nw_pad = next_power_of_2(d // 8)
    _pack_kernel[grid](
        x, pages, blocks, x.shape[2], x.stride(0), x.stride(1), x.stride(2),
        blocks.stride(0), blocks.stride(1), D=d, G=spec.group_size, BITS=spec.bits,
        SYMMETRIC=spec.symmetric, NW_PAD=nw_pad, ROTATE=rotate,
        HALVES=all(v % 2 == 0 for v in (blocks.data_ptr(), *blocks.stride()[:2])),
        enable_fp_fusion=False, num_warps=_warps(rotate),
    )  # fmt: skip


def _warps(rotate: bool) -> int:
    """Warps a page program (sm_90a builds, ``kernel_resources.py``: plain pages on one warp,
    168 registers, under Triton 3.9; Triton 3.6, the GPU machines', spilled 2.2-2.4 KB there and
    built clean on 8 warps, 112-116 registers; Hadamard pages 4 warps, 56 under both)."""
    if rotate:
        return 4
    return 1 if triton_version() >= (3, 7) else 8
