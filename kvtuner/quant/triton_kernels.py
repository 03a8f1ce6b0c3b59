"""Triton kernels for the packed format v3, beside their launchers.

``triton_scatter_quantized``: ``buffer[loc] = quantize(x)`` (``triton_scatter_kv``: K's and V's
in one launch); ``triton_gather_dequantized``: ``dequantize(buffer[loc])``; either with
``planes``, the pool's slots laid out as :mod:`.planes` (a row's metadata at
:func:`~.triton_codes.meta_offset` from its codes).
Token axis only (what a slot pool stores), every bits value of ``SUPPORTED_BITS`` (2/3/4/5/6/8, and
16 = fp16 bytes). Each program handles ``BLOCKS`` row blocks of ``BLOCK`` tokens of one KV head
(:class:`PoolPlan`; several blocks run in a loop whose copies Triton pipelines); a row's codes are
held as a tile [BLOCK, D/8, 8]: 8 consecutive codes are one word of ``bits`` bytes of the row's
little-endian bit stream (3/5/6 bits: two, a low and a high plane,
:func:`kvtuner.quant.packing.pack_codes`). Codes pack into bytes of whole codes in int32 (the
tile reshaped to [BLOCK, code_bytes, codes_per_byte]); a high plane's into words by shifts fixed at
compile time (:func:`.triton_codes.high_shifts`). A row's bytes move in units of the power of
two every row offset shares (``ALIGN``): 16 or 8 bytes a store where rows allow.

The bytes equal :mod:`.reference` exactly: IEEE ``1 / scale`` (``div_rn``) once a group, no FMA
contraction (``enable_fp_fusion=False``), half-up rounding, fp16 metadata rounded down/up by a
one-ulp step on its int16 bits (rotated rows: see :func:`.triton_codes.hadamard_tile`). The
Hadamard rotation is fused: fp32 butterflies on the tile, after the load (scatter) or before the
store (gather); a call is one launch.

The grid is heads × programs: the GPU hands out a token block's heads one after another, so they
run side by side. A slot holds its heads' rows back to back (KV4 g32 at d 128: 80 bytes each),
so two heads share the 32-byte sectors at their rows' ends; run together, their writes fill each
sector in L2 (a partly written sector is read back before it goes to DRAM), and their reads of
it are one. A token at a time, x and a gather's output are read and written contiguously too.

Importing this module imports triton and builds the kernels: set ``TRITON_INTERPRET=1`` before
that to run them on CPU tensors (tests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .intmath import cdiv, next_power_of_2
from .planes import plannable
from .spec import QuantSpec
from .triton_codes import (
    NAN_FP16,
    chunks_readable,
    grid_codes,
    hadamard_tile,
    load_chunk_codes,
    load_chunk_meta,
    load_codes,
    load_fp16,
    load_group_meta,
    meta_offset,
    store_codes,
    store_fp16,
    store_group_meta,
)

__all__ = [
    "PoolPlan",
    "interpreted",
    "plan_pool",
    "triton_gather_dequantized",
    "triton_scatter_kv",
    "triton_scatter_quantized",
    "triton_version",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _store_out(ptr, v, mask, OUT_BF16: tl.constexpr):
    """Store fp32 ``v`` in the output's dtype. ``OUT_BF16``: bf16 outputs arrive as an int16
    view and are rounded to nearest-even here, for Triton's interpreter (it truncates fp32 ->
    bf16 casts); a GPU's cast rounds to nearest-even in one instruction a pair (KV4 g32 unpack
    on sm_90a: about 150 instructions fewer of 524)."""
    if OUT_BF16:
        bits = v.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        tl.store(ptr, tl.where(v != v, 0x7FC0, rounded).to(tl.int16), mask=mask)
    else:
        tl.store(ptr, v.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _x_offsets(tokens, stride_xt, stride_xh):
    """Offsets [BLOCK] of this program's rows in x [N, heads, D] (any token/head strides: e.g.
    K sliced out of a fused QKV projection, read without a copy)."""
    return tokens * stride_xt + tl.program_id(0).to(tl.int64) * stride_xh


@triton.jit
def _out_rows(tokens):
    """Rows [BLOCK] of this program in the [N * heads] rows of a gather's output."""
    return tokens * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _row_bases(
    buf_ptr, loc_ptr, n_tokens, stride_slot, stride_head, blk, BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
):  # fmt: skip
    """Row block ``blk``: BLOCK tokens of this program's KV head (grid: heads × token blocks,
    so no row index is divided by the head count) -> tokens [BLOCK], their mask and buffer row
    pointers.
    Strides come in ``ALIGN``-byte units: a row offset is then a known multiple of ALIGN, so a
    row's bytes move 8 or 16 at a time where the rows allow (136-byte KV8 g64 rows: 8)."""
    tokens = blk * BLOCK + tl.arange(0, BLOCK)
    row_ok = tokens < n_tokens
    slot = tl.load(loc_ptr + tokens, mask=row_ok, other=0).to(tl.int64)
    unit = slot * stride_slot + tl.program_id(0).to(tl.int64) * stride_head
    return tokens.to(tl.int64), row_ok, buf_ptr + unit * ALIGN


@triton.jit
def _row_blocks(n_tokens, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """This program's row blocks [first, last): ``BLOCKS`` consecutive ones (grid: the token
    blocks / BLOCKS, rounded up)."""
    first = tl.program_id(1) * BLOCKS
    return first, tl.minimum(first + BLOCKS, tl.cdiv(n_tokens, BLOCK))


@triton.jit
def _group_tile(x_ptr, at, row_ok, D: tl.constexpr, G: tl.constexpr, NG_PAD: tl.constexpr):
    """fp32 [BLOCK, NG_PAD, G] of the rows at ``at`` [BLOCK]: each group's chunks of 8 loaded
    on their own and joined (:func:`_chunks`), so that every thread holds whole groups (a
    group's min, max and grid in one thread, not reduced across lanes) under the Triton the GPU
    machines run (3.6) as under CI's (3.9). One load permuted to put the chunk axis outermost
    did so under 3.9 only (sm_90a, pack at 32 rows × 1 warp, KV4 g32 / KV8 g64 / KV4 g128,
    Triton 3.6: 2856-3056 instructions a program with 64-128 shuffles, against 1536-1728 and
    none joined; 3.9: 1528-1720 either way)."""
    return _chunks(x_ptr, at, row_ok, D, G, NG_PAD, 0, G // 8)


@triton.jit
def _chunks(x_ptr, at, row_ok, D: tl.constexpr, G: tl.constexpr, NG_PAD: tl.constexpr,
            C0: tl.constexpr, C: tl.constexpr):  # fmt: skip
    """Chunks [C0, C0 + C) of 8 elements of each group (C a power of two) -> fp32 [BLOCK,
    NG_PAD, 8·C], halves joined: ``tl.join``'s new axis lies in a thread's registers."""
    if C == 1:
        e = tl.arange(0, NG_PAD)[None, :, None] * G + C0 * 8 + tl.arange(0, 8)[None, None, :]
        mask = row_ok[:, None, None] & (e < D)
        x = tl.load(x_ptr + at[:, None, None] + e, mask=mask, other=0.0).to(tl.float32)
    else:
        lo = _chunks(x_ptr, at, row_ok, D, G, NG_PAD, C0, C // 2)
        hi = _chunks(x_ptr, at, row_ok, D, G, NG_PAD, C0 + C // 2, C // 2)
        BLOCK: tl.constexpr = at.shape[0]
        x = tl.reshape(tl.permute(tl.join(lo, hi), (0, 1, 3, 2)), [BLOCK, NG_PAD, C * 8])
    return x


@triton.jit
def _scatter_kv_kernel(
    k_ptr, v_ptr, loc_ptr, k_buf_ptr, v_buf_ptr, n_tokens, k_programs, v_programs,
    D: tl.constexpr, NW_PAD: tl.constexpr,
    K_STRIDE_SLOT, K_STRIDE_HEAD, K_STRIDE_XT, K_STRIDE_XH, K_G: tl.constexpr,
    K_BITS: tl.constexpr, K_SYMMETRIC: tl.constexpr, K_BLOCK: tl.constexpr,
    K_ROTATE: tl.constexpr, K_ALIGN: tl.constexpr, K_WHOLE: tl.constexpr, K_BLOCKS: tl.constexpr,
    K_STAGES: tl.constexpr, K_PLANES: tl.constexpr,
    V_STRIDE_SLOT, V_STRIDE_HEAD, V_STRIDE_XT, V_STRIDE_XH, V_G: tl.constexpr,
    V_BITS: tl.constexpr, V_SYMMETRIC: tl.constexpr, V_BLOCK: tl.constexpr,
    V_ROTATE: tl.constexpr, V_ALIGN: tl.constexpr, V_WHOLE: tl.constexpr, V_BLOCKS: tl.constexpr,
    V_STAGES: tl.constexpr, V_PLANES: tl.constexpr,
):  # fmt: skip
    """K and V of one write in one launch (grid: heads × programs × 2, axis 2 the side): each
    side's program is :func:`_scatter_kernel`, specialised by its own constants, so K8V4
    packs each side as its own launch would; programs past a side's own count do nothing."""
    if tl.program_id(2) == 0:
        if tl.program_id(1) < k_programs:
            _scatter_kernel(k_ptr, loc_ptr, k_buf_ptr, n_tokens, K_STRIDE_SLOT, K_STRIDE_HEAD,
                K_STRIDE_XT, K_STRIDE_XH, D, K_G, K_BITS, K_SYMMETRIC, NW_PAD, K_BLOCK,
                K_ROTATE, K_ALIGN, K_WHOLE, K_BLOCKS, K_STAGES, K_PLANES)  # fmt: skip
    else:
        if tl.program_id(1) < v_programs:
            _scatter_kernel(v_ptr, loc_ptr, v_buf_ptr, n_tokens, V_STRIDE_SLOT, V_STRIDE_HEAD,
                V_STRIDE_XT, V_STRIDE_XH, D, V_G, V_BITS, V_SYMMETRIC, NW_PAD, V_BLOCK,
                V_ROTATE, V_ALIGN, V_WHOLE, V_BLOCKS, V_STAGES, V_PLANES)  # fmt: skip


@triton.jit
def _scatter_kernel(
    x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot, stride_head, stride_xt,
    stride_xh, D: tl.constexpr, G: tl.constexpr, BITS: tl.constexpr, SYMMETRIC: tl.constexpr,
    NW_PAD: tl.constexpr, BLOCK: tl.constexpr, ROTATE: tl.constexpr, ALIGN: tl.constexpr,
    WHOLE: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
    PLANES: tl.constexpr,
):  # fmt: skip
    """One program of a pack: its ``BLOCKS`` row blocks of KV head ``program_id(0)``."""
    # a row's scales and zeros this many bytes after its codes (rows, or planes: .planes)
    md = meta_offset(
        tl.program_id(0).to(tl.int64), tl.num_programs(0), D, BITS, G, SYMMETRIC, PLANES, 1
    )
    if BLOCKS == 1:  # no loop: one that runs once builds otherwise (sm_90a Hadamard pack at
        # 16 rows x 4 warps: 121 registers, not 95)
        _scatter_block(tl.program_id(1), x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot,
            stride_head, stride_xt, stride_xh, md, D, G, BITS, SYMMETRIC, NW_PAD, BLOCK,
            ROTATE, ALIGN, WHOLE, PLANES)  # fmt: skip
    else:
        first, last = _row_blocks(n_tokens, BLOCK, BLOCKS)
        for blk in tl.range(first, last, num_stages=STAGES):
            _scatter_block(blk, x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot, stride_head,
                stride_xt, stride_xh, md, D, G, BITS, SYMMETRIC, NW_PAD, BLOCK, ROTATE, ALIGN,
                WHOLE, PLANES)  # fmt: skip


@triton.jit
def _scatter_block(blk, x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot, stride_head, stride_xt,
    stride_xh, md, D, G, BITS, SYMMETRIC, NW_PAD, BLOCK, ROTATE, ALIGN, WHOLE,
    PLANES):  # fmt: skip
    """Row block ``blk`` of :func:`_scatter_kernel`."""
    rows, row_ok, dst = _row_bases(
        buf_ptr, loc_ptr, n_tokens, stride_slot, stride_head, blk, BLOCK, ALIGN
    )
    at = _x_offsets(rows, stride_xt, stride_xh)
    x = _pack_tile(x_ptr, at, row_ok, D, G, NW_PAD, ROTATE, WHOLE)
    _store_rows(dst, dst + md, x, row_ok, D, BITS, SYMMETRIC, NW_PAD, ALIGN, PLANES)


@triton.jit
def _pack_tile(x_ptr, at, row_ok, D: tl.constexpr, G: tl.constexpr, NW_PAD: tl.constexpr,
               ROTATE: tl.constexpr, WHOLE: tl.constexpr):  # fmt: skip
    """The rows at ``at`` [BLOCK] as fp32 [BLOCK, NG_PAD, G], rotated where ``ROTATE``; held
    a whole row a thread (``WHOLE``), whole groups a thread (G a multiple of 8), or a row over
    the threads Triton picks."""
    BLOCK: tl.constexpr = at.shape[0]
    NW: tl.constexpr = D // 8  # chunks of 8 elements a row
    NG_PAD: tl.constexpr = NW_PAD * 8 // G  # groups of the padded tile (extra ones not stored)
    if WHOLE:
        x = tl.reshape(_group_tile(x_ptr, at, row_ok, D, NW_PAD * 8, 1), [BLOCK, NW_PAD, 8])
    elif ROTATE or G % 8:
        w = tl.arange(0, NW_PAD)
        e = w[:, None] * 8 + tl.arange(0, 8)[None, :]  # [NW_PAD, 8] element index in the row
        mask = row_ok[:, None, None] & (w < NW)[None, :, None]
        x = tl.load(x_ptr + at[:, None, None] + e[None], mask=mask, other=0.0)
        x = x.to(tl.float32)  # [BLOCK, NW_PAD, 8]
    else:
        x = _group_tile(x_ptr, at, row_ok, D, G, NG_PAD)
    if ROTATE:  # x is [BLOCK, NW_PAD, 8] on both branches that take rotated rows
        x = hadamard_tile(x, D)
    return tl.reshape(x, [BLOCK, NG_PAD, G])  # the same elements, one group a middle index


@triton.jit
def _store_rows(dst, meta_dst, x, row_ok, D: tl.constexpr, BITS: tl.constexpr,
                SYMMETRIC: tl.constexpr, NW_PAD: tl.constexpr, ALIGN: tl.constexpr,
                PLANES: tl.constexpr):  # fmt: skip
    """Quantize fp32 ``x`` [BLOCK, NG_PAD, G] and store the rows' codes at ``dst`` [BLOCK],
    their scales and zeros at ``meta_dst`` (2-byte aligned in planes: whole words)."""
    BLOCK: tl.constexpr = x.shape[0]
    G: tl.constexpr = x.shape[2]
    NB: tl.constexpr = D // 8 * BITS  # code bytes per row
    NG: tl.constexpr = D // G
    NG_PAD: tl.constexpr = x.shape[1]
    q, scale, zero, ok = grid_codes(x, 2, BITS, SYMMETRIC)  # scale, zero, ok: [BLOCK, NG_PAD]
    if NG == NG_PAD:  # the row's scales and zeros as one vector
        HALVES: tl.constexpr = ALIGN % 2 + (0 if PLANES else NB % 2) == 0  # 2-byte aligned
        store_group_meta(meta_dst, scale, zero, ok, row_ok, 0, SYMMETRIC, HALVES)
    else:
        g = tl.arange(0, NG_PAD)
        meta = meta_dst[:, None] + 2 * g[None, :]  # [BLOCK, NG_PAD] fp16 scale slots
        meta_ok = row_ok[:, None] & (g < NG)[None, :]
        if not SYMMETRIC:
            store_fp16(meta + 2 * NG, zero, ok, meta_ok)
        store_fp16(meta, scale, ok, meta_ok)
    q = tl.reshape(q.to(tl.int32), [BLOCK, NW_PAD, 8])
    store_codes(dst, q, row_ok, NB, BITS)


@triton.jit
def _gather_kernel(
    buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot, stride_head, D: tl.constexpr,
    G: tl.constexpr, BITS: tl.constexpr, SYMMETRIC: tl.constexpr, NW_PAD: tl.constexpr,
    BLOCK: tl.constexpr, OUT_BF16: tl.constexpr, ROTATE: tl.constexpr, ALIGN: tl.constexpr,
    WHOLE: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
    PLANES: tl.constexpr,
):  # fmt: skip
    md = meta_offset(
        tl.program_id(0).to(tl.int64), tl.num_programs(0), D, BITS, G, SYMMETRIC, PLANES, 1
    )
    if BLOCKS == 1:  # no loop (see _scatter_kernel)
        _gather_block(tl.program_id(1), buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot,
            stride_head, md, D, G, BITS, SYMMETRIC, NW_PAD, BLOCK, OUT_BF16, ROTATE, ALIGN,
            WHOLE, PLANES)  # fmt: skip
    else:
        first, last = _row_blocks(n_tokens, BLOCK, BLOCKS)
        for blk in tl.range(first, last, num_stages=STAGES):
            _gather_block(blk, buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot, stride_head,
                md, D, G, BITS, SYMMETRIC, NW_PAD, BLOCK, OUT_BF16, ROTATE, ALIGN,
                WHOLE, PLANES)  # fmt: skip


@triton.jit
def _gather_block(blk, buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot, stride_head, md, D,
    G, BITS, SYMMETRIC, NW_PAD, BLOCK, OUT_BF16, ROTATE, ALIGN, WHOLE,
    PLANES):  # fmt: skip
    """Row block ``blk`` of :func:`_gather_kernel`."""
    rows, row_ok, src = _row_bases(
        buf_ptr, loc_ptr, n_tokens, stride_slot, stride_head, blk, BLOCK, ALIGN
    )
    META4: tl.constexpr = ALIGN % 4 + (0 if PLANES else D * BITS // 8 % 4) == 0  # 4-aligned
    # a chunk of 8 codes a thread, as the store takes them: where a row is stored over threads
    CHUNKS: tl.constexpr = not (ROTATE or WHOLE) and chunks_readable(BITS, G, D, ALIGN)
    out = _dequantized_rows(src, src + md, row_ok, D, G, BITS, SYMMETRIC, NW_PAD, META4, CHUNKS)
    if ROTATE or WHOLE:  # a whole row a thread: stored as [D/8, BLOCK, 8], the chunk axis
        # outermost, so each thread holds a row's chunks
        w = tl.arange(0, NW_PAD)
        if ROTATE:  # undo the rotation (H is its own inverse)
            out = hadamard_tile(out, D)
        out = tl.permute(out, (1, 0, 2))
        at = out_ptr + _out_rows(rows)[None, :, None] * D + (w[:, None] * 8)[:, None, :]
        mask = row_ok[None, :, None] & (w < D // 8)[:, None, None]
        _store_out(at + tl.arange(0, 8)[None, None, :], out, mask, OUT_BF16)
    else:
        # one axis of BLOCK·NW_PAD chunks, a row's consecutive, as the loads take them
        # (triton_codes._chunk_load): a warp's lanes store a row's chunks in turn
        f = tl.arange(0, BLOCK * NW_PAD)
        token, chunk = (blk * BLOCK + f // NW_PAD).to(tl.int64), f % NW_PAD
        at = (_out_rows(token) * D + chunk * 8)[:, None] + tl.arange(0, 8)[None, :]
        ok = ((token < n_tokens) & (chunk < D // 8))[:, None]
        _store_out(out_ptr + at, tl.reshape(out, [BLOCK * NW_PAD, 8]), ok, OUT_BF16)


@triton.jit
def _dequantized_rows(src, meta_src, row_ok, D: tl.constexpr, G: tl.constexpr,
                      BITS: tl.constexpr, SYMMETRIC: tl.constexpr, NW_PAD: tl.constexpr,
                      META4: tl.constexpr, CHUNKS: tl.constexpr):  # fmt: skip
    """The rows whose codes are at ``src`` [BLOCK], scales and zeros at ``meta_src`` (4-byte
    aligned: ``META4``), dequantized: fp32 [BLOCK, NW_PAD, 8]; ``CHUNKS``: a chunk of 8 a
    thread (:func:`~.triton_codes.load_chunk_codes`)."""
    BLOCK: tl.constexpr = row_ok.shape[0]
    NB: tl.constexpr = D // 8 * BITS
    NG: tl.constexpr = D // G
    NG_PAD: tl.constexpr = NW_PAD * 8 // G
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    if CHUNKS:
        q = load_chunk_codes(src, row_ok, D // 8, NW_PAD, BITS)
        # fp32 2^23 + q less 2^23: exactly q, off the quarter-rate I2F pipe (sm_90a, Triton
        # 3.9: 40-48 registers a thread -> 32, 16 programs an SM; 3.6 built 32 either way)
        q = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        scale, zero = load_chunk_meta(meta_src, row_ok, NW_PAD, G, NG, SYMMETRIC)
        return _dequantized(q, scale, zero, HALF, SYMMETRIC)
    q = load_codes(src, row_ok, NB, NW_PAD, BITS)  # [BLOCK, NW_PAD, 8]
    q = tl.reshape(q, [BLOCK, NG_PAD, G])
    if NG == NG_PAD:  # the row's scales and zeros in one vector load
        scale, zero = load_group_meta(meta_src, row_ok, 0, NG, SYMMETRIC, META4)
    else:
        g = tl.arange(0, NG_PAD)
        meta = meta_src[:, None] + 2 * g[None, :]  # [BLOCK, NG_PAD]: one load per group and row
        meta_ok = row_ok[:, None] & (g < NG)[None, :]
        scale = load_fp16(meta, meta_ok)
        zero = scale if SYMMETRIC else load_fp16(meta + 2 * NG, meta_ok)
    out = _dequantized(q, scale[:, :, None], zero[:, :, None], HALF, SYMMETRIC)
    return tl.reshape(out, [BLOCK, NW_PAD, 8])


@triton.jit
def _dequantized(q, scale, zero, HALF: tl.constexpr, SYMMETRIC: tl.constexpr):
    """fp32 codes ``q`` with their scales and zeros (broadcast to q) -> values."""
    if SYMMETRIC:  # noqa: SIM108 (constexpr branch: only one side is compiled)
        out = tl.math.div_rn((q - HALF) * scale, HALF * 1.0)
    else:
        out = zero + q * scale
    return out


@triton.jit
def _fp16_columns(row_ok, D: tl.constexpr, D_PAD: tl.constexpr):
    """16-bit rows: the columns [D_PAD] of a row and their mask [BLOCK, D_PAD]."""
    e = tl.arange(0, D_PAD)
    return e, row_ok[:, None] & (e < D)[None]


@triton.jit
def _scatter_fp16_kernel(
    x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot, stride_head, stride_xt, stride_xh,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
    BLOCKS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    if BLOCKS == 1:  # no loop (see _scatter_kernel)
        _scatter_fp16_block(tl.program_id(1), x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot,
            stride_head, stride_xt, stride_xh, D, D_PAD, BLOCK, ALIGN)  # fmt: skip
    else:
        first, last = _row_blocks(n_tokens, BLOCK, BLOCKS)
        for blk in tl.range(first, last, num_stages=STAGES):
            _scatter_fp16_block(blk, x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot,
                stride_head, stride_xt, stride_xh, D, D_PAD, BLOCK, ALIGN)  # fmt: skip


@triton.jit
def _scatter_fp16_block(blk, x_ptr, loc_ptr, buf_ptr, n_tokens, stride_slot, stride_head,
    stride_xt, stride_xh, D, D_PAD, BLOCK, ALIGN):  # fmt: skip
    """Row block ``blk`` of :func:`_scatter_fp16_kernel`."""
    rows, row_ok, dst = _row_bases(
        buf_ptr, loc_ptr, n_tokens, stride_slot, stride_head, blk, BLOCK, ALIGN
    )
    e, mask = _fp16_columns(row_ok, D, D_PAD)
    at = _x_offsets(rows, stride_xt, stride_xh)
    x = tl.load(x_ptr + at[:, None] + e[None], mask=mask, other=0.0).to(tl.float32)
    bits = x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)  # [BLOCK, D_PAD]
    bits = tl.where(x == x, bits, NAN_FP16)  # the format's NaN, whatever the GPU's cvt gives
    halves = dst.to(tl.pointer_type(tl.int16))  # a row's fp16 as one vector, not byte pairs
    tl.store(halves[:, None] + e[None], bits.to(tl.int16), mask=mask)


@triton.jit
def _gather_fp16_kernel(
    buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot, stride_head, D: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr, ALIGN: tl.constexpr,
    BLOCKS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    if BLOCKS == 1:  # no loop (see _scatter_kernel)
        _gather_fp16_block(tl.program_id(1), buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot,
            stride_head, D, D_PAD, BLOCK, OUT_BF16, ALIGN)  # fmt: skip
    else:
        first, last = _row_blocks(n_tokens, BLOCK, BLOCKS)
        for blk in tl.range(first, last, num_stages=STAGES):
            _gather_fp16_block(blk, buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot,
                stride_head, D, D_PAD, BLOCK, OUT_BF16, ALIGN)  # fmt: skip


@triton.jit
def _gather_fp16_block(blk, buf_ptr, loc_ptr, out_ptr, n_tokens, stride_slot, stride_head, D,
    D_PAD, BLOCK, OUT_BF16, ALIGN):  # fmt: skip
    """Row block ``blk`` of :func:`_gather_fp16_kernel`."""
    rows, row_ok, src = _row_bases(
        buf_ptr, loc_ptr, n_tokens, stride_slot, stride_head, blk, BLOCK, ALIGN
    )
    e, mask = _fp16_columns(row_ok, D, D_PAD)
    halves = src.to(tl.pointer_type(tl.int16))
    x = tl.load(halves[:, None] + e[None], mask=mask, other=0)
    x = x.to(tl.float16, bitcast=True).to(tl.float32)
    _store_out(out_ptr + _out_rows(rows)[:, None] * D + e[None], x, mask, OUT_BF16)


def triton_version() -> tuple[int, int]:
    """(major, minor) of the Triton building the kernels: a plan read off one Triton's sm_90a
    build can spill under another's (docs/results/gpu.md › Triton 3.6)."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def interpreted() -> bool:
    """True when this module's kernels, and Triton's own ``triton.language`` functions they call
    (``tl.zeros``, ``tl.max``...), were built for Triton's CPU interpreter. The latter are built
    once, when triton is first imported: TRITON_INTERPRET=1 must be set before that."""
    from triton.language import standard

    built = (_scatter_kernel, standard.zeros)
    return all(type(f).__name__ == "InterpretedFunction" for f in built)


def _check(
    buffer: torch.Tensor, loc: torch.Tensor, spec: QuantSpec, head_dim: int, planes: bool
) -> None:
    if not isinstance(spec, QuantSpec) or spec.axis != "token":
        raise ValueError(f"Triton kernels take a token-axis QuantSpec, got {spec!r}")
    if buffer.dtype != torch.uint8 or buffer.dim() != 3 or buffer.stride(2) != 1:
        raise ValueError(
            f"buffer must be uint8 [slots, heads, row_bytes] with contiguous rows, got "
            f"{buffer.dtype} {tuple(buffer.shape)} strides {buffer.stride()}"
        )
    if buffer.shape[2] != spec.row_bytes(head_dim):
        raise ValueError(
            f"buffer rows have {buffer.shape[2]} bytes, {spec.short()} at head_dim {head_dim} "
            f"needs {spec.row_bytes(head_dim)}"
        )
    if loc.dim() != 1 or loc.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"loc must be 1-D int32/int64, got {loc.dtype} {tuple(loc.shape)}")
    if not spec.is_quantized and _row_align(buffer, buffer.stride(1)) == 1:
        raise ValueError("16-bit rows must start at even byte offsets (they move as fp16)")
    if loc.device != buffer.device:
        raise ValueError(f"loc is on {loc.device}, buffer on {buffer.device}")
    if planes and (not plannable(spec, head_dim) or buffer.stride(1) != buffer.shape[2]):
        raise ValueError(
            f"planes need quantized token rows of whole words and a slot's heads adjacent: "
            f"{spec.short()} at head_dim {head_dim}, strides {buffer.stride()}"
        )
    if not buffer.is_cuda and not interpreted():
        raise ValueError(
            "Triton kernels need CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 before "
            "triton is first imported in this process"
        )


@dataclass(frozen=True)
class PoolPlan:
    """How one pack or unpack launch is cut: ``block_rows`` token rows of one KV head a row
    block on ``num_warps`` warps; ``whole_rows``: a whole row a thread (else whole groups a
    thread in pack, or the threads Triton picks); ``blocks``: row blocks a program, in a loop
    whose copies run ``stages`` deep (``stages`` 1: no pipelining; more: Triton copies the
    next blocks' rows while this one computes)."""

    block_rows: int = 32
    num_warps: int = 1
    whole_rows: bool = False
    blocks: int = 1
    stages: int = 1

    def __post_init__(self) -> None:
        rows = self.block_rows
        if rows < 1 or rows & (rows - 1) or self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"need power-of-two block_rows and 1, 2, 4 or 8 warps: {self}")
        if not isinstance(self.whole_rows, bool) or self.blocks < 1 or self.stages < 1:
            raise ValueError(f"need a bool whole_rows, blocks >= 1 and stages >= 1: {self}")

    def filling(self, tokens: int, heads: int, sms: int | None) -> PoolPlan:
        """This plan for a launch of ``tokens`` × ``heads`` rows on ``sms`` SMs: row blocks
        halved, down to :data:`FEWEST_ROWS`, while the launch holds fewer programs than SMs. At
        decode sizes a pack takes one program's time, and a program's warp quantizes its
        block's groups in turn (sm_90a, Triton 3.6, one warp: KV4 g32 1722 instructions a
        program at 32 rows, 558 at 8 and 56 registers against 164; KV8 g64 1680 -> 651; KV4
        g128 1520 -> 643). Unchanged with a whole row a thread (each thread's work is a row
        at any block) or without ``sms`` (CPU)."""
        if self.whole_rows or sms is None:
            return self
        block = min(self.block_rows, next_power_of_2(max(tokens, 1)))
        while block > FEWEST_ROWS and cdiv(cdiv(tokens, block), self.blocks) * heads < sms:
            block //= 2
        return self if block >= self.block_rows else replace(self, block_rows=block)


FEWEST_ROWS = 8  # rows a program :meth:`PoolPlan.filling` goes down to: a group of KV4 g32 a lane
MOST_PROGRAMS = 65535  # a CUDA grid's second axis


def plan_pool(spec: QuantSpec, *, pack: bool) -> PoolPlan:
    """The plan of :func:`triton_scatter_quantized` (``pack``) or
    :func:`triton_gather_dequantized` for rows of ``spec``: as the H200 timed them (65k-262k
    tokens × 8 heads, d 128; docs/results/gpu.md › "H200, 2026-11-26, second lease"), except
    Hadamard pack, build-predicted.

    - pack: 32 rows on one warp, whole groups a thread (0.42-0.71× ``clone()``; 4 warps took
      0.34-0.68×); the launcher cuts it to as few as 8 rows at decode sizes
      (:meth:`PoolPlan.filling`, build-predicted);
    - unpack: 32 rows on 4 warps, 32-40 registers, up to 16 programs an SM (0.42-0.48×; one
      warp, 156 registers and 13 warps an SM, took 0.20-0.31×);
    - Hadamard unpack: a whole row a thread on one warp (0.65×; 4 warps 0.56×);
    - Hadamard pack: a whole row a thread on one warp, 8 row blocks a program copied 3 deep.
      Timed: 16 rows on 4 warps, a row over 8 threads, 0.17-0.19×: 605 instructions a row
      (its butterflies cross threads: 4 layout changes, 176 shuffles), about its time at 4
      issues a cycle on 132 SMs; a whole row a thread without the loop, 0.03×: its 16 row
      loads spread through the butterflies, so each program waited on memory ten times in
      turn. The loop's copies go out before the butterflies (sm_90a: 90 instructions a row,
      182 registers, 11 programs an SM; Triton 3.6, the GPU machines': 91, 202, 10, since its
      rows are loaded a chunk at a time and joined, :func:`_group_tile`)."""
    if _rotates(spec):
        if pack:
            return PoolPlan(32, 1, whole_rows=True, blocks=8, stages=3)
        return PoolPlan(32, 1, whole_rows=True)
    return PoolPlan(32, 1) if pack else PoolPlan(32, 4)


def _launch_args(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    spec: QuantSpec,
    head_dim: int,
    plan: PoolPlan,
    planes: bool = False,
):
    """Grid and the keyword arguments shared by every kernel of one call."""
    n_tokens = loc.shape[0]
    if not spec.is_quantized and plan.whole_rows:
        raise ValueError("16-bit rows have no groups: a plan for them takes whole_rows=False")
    block = min(plan.block_rows, next_power_of_2(max(n_tokens, 1)))
    row_blocks = cdiv(n_tokens, block)
    # more row blocks a program where the programs would pass a grid's second axis
    blocks = max(min(plan.blocks, row_blocks), cdiv(row_blocks, MOST_PROGRAMS))
    grid = (buffer.shape[1], cdiv(row_blocks, blocks))  # heads first: the module doc
    head = spec.code_bytes(head_dim) if planes else buffer.stride(1)  # head to head: codes
    align = _row_align(buffer, head)
    common = dict(
        n_tokens=n_tokens,
        stride_slot=buffer.stride(0) // align,
        stride_head=head // align,
        D=head_dim,
        BLOCK=block,
        ALIGN=align,
        BLOCKS=blocks,
        STAGES=plan.stages,
        enable_fp_fusion=False,
        num_warps=plan.num_warps,
    )
    if spec.is_quantized:
        nw_pad = next_power_of_2(head_dim // 8)
        common.update(
            G=spec.group_size,
            BITS=spec.bits,
            SYMMETRIC=spec.symmetric,
            NW_PAD=nw_pad,
            ROTATE=_rotates(spec),
            WHOLE=plan.whole_rows,
            PLANES=planes,
        )
    else:
        common.update(D_PAD=next_power_of_2(head_dim))
    return grid, common


def _row_align(buffer: torch.Tensor, head_stride: int) -> int:
    """Bytes (16, 8, 4, 2 or 1) that every row's (codes') offset in ``buffer`` is a multiple
    of, heads ``head_stride`` bytes apart."""
    for align in (16, 8, 4, 2):
        strides = (buffer.stride(0), head_stride)
        if buffer.data_ptr() % align == 0 and all(s % align == 0 for s in strides):
            return align
    return 1


def _sms(device: torch.device) -> int | None:
    """The SMs of a CUDA ``device``; None elsewhere."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def _rotates(spec: QuantSpec) -> bool:
    return spec.is_quantized and spec.rotation == "hadamard"


def triton_scatter_quantized(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    plan: PoolPlan | None = None,
    planes: bool = False,
) -> None:
    """``buffer[loc] = quantize(x, spec)`` for x[N, heads, D]; other slots stay untouched
    (``planes``: laid out as :mod:`.planes`). One kernel launch: the Hadamard rotation runs
    inside it; x is read through its strides (a copy only when its last dim is strided).
    ``plan`` None: :func:`plan_pool`'s."""
    x = _pack_input(buffer, loc, x, spec, planes)
    if loc.shape[0]:
        _launch_pack(buffer, loc, x, spec, planes, plan)


def _launch_pack(buffer, loc, x, spec: QuantSpec, planes: bool, plan: PoolPlan | None) -> None:
    """One pack launch of checked, non-empty inputs (:func:`_pack_input`)."""
    plan = plan or _pack_plan(spec, loc.shape[0], buffer.shape[1], _sms(x.device))
    grid, args = _launch_args(buffer, loc, spec, x.shape[2], plan, planes)
    kernel = _scatter_kernel if spec.is_quantized else _scatter_fp16_kernel
    kernel[grid](x, loc, buffer, stride_xt=x.stride(0), stride_xh=x.stride(1), **args)


def triton_scatter_kv(
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
    """:func:`triton_scatter_quantized` of K and of V into the same slots, in one launch
    where both sides are quantized (else a launch a side): a decode step's write is then one
    kernel a layer, not two. Each side packs the bytes its own launch would, on the plan its
    own launch would take for a launch of both sides' programs."""
    k = _pack_input(k_buffer, loc, k, k_spec, planes[0])
    v = _pack_input(v_buffer, loc, v, v_spec, planes[1])
    if k.shape[1:] != v.shape[1:]:
        raise ValueError(f"K and V differ in heads or head_dim: {k.shape} and {v.shape}")
    if loc.shape[0] == 0:
        return
    if not (k_spec.is_quantized and v_spec.is_quantized):  # 16-bit rows: a launch a side
        _launch_pack(k_buffer, loc, k, k_spec, planes[0], None)
        _launch_pack(v_buffer, loc, v, v_spec, planes[1], None)
        return
    grid, args = _kv_launch_args(k_buffer, v_buffer, loc, (k, v), (k_spec, v_spec), planes,
                                 _sms(k.device))  # fmt: skip
    _scatter_kv_kernel[grid](k, v, loc, k_buffer, v_buffer, **args)


def _kv_launch_args(k_buffer, v_buffer, loc, xs, specs, planes, sms: int | None):
    """Grid and arguments of :func:`_scatter_kv_kernel` (checked inputs ``xs``: K and V): each
    side's :func:`_launch_args` on the plan it takes for a launch of both sides' programs (twice
    the heads), its own ones renamed ``K_*``/``V_*``."""
    n, heads, dim = loc.shape[0], k_buffer.shape[1], xs[0].shape[2]
    sides = [
        _launch_args(buffer, loc, spec, dim, _pack_plan(spec, n, 2 * heads, sms), side)
        for buffer, spec, side in zip((k_buffer, v_buffer), specs, planes, strict=True)
    ]
    args = {name: sides[0][1][name] for name in ("n_tokens", "D", "NW_PAD", "enable_fp_fusion")}
    args["num_warps"] = max(common["num_warps"] for _, common in sides)  # a layout, not a result
    for side, (grid, common), x in zip("KV", sides, xs, strict=True):
        args[f"{side.lower()}_programs"] = grid[1]
        args.update({renamed: common[name] for name, renamed in _SIDE_ARGS[side]})
        args[f"{side}_STRIDE_XT"], args[f"{side}_STRIDE_XH"] = x.stride(0), x.stride(1)
    return (heads, max(sides[0][0][1], sides[1][0][1]), 2), args  # heads × programs × K/V


# a pack launch's arguments that differ between K and V, and their names in the kv kernel
_SIDE_NAMES = ("stride_slot", "stride_head", "G", "BITS", "SYMMETRIC", "BLOCK", "ROTATE")
_SIDE_NAMES += ("ALIGN", "WHOLE", "BLOCKS", "STAGES", "PLANES")
_SIDE_ARGS = {side: [(name, f"{side}_{name.upper()}") for name in _SIDE_NAMES] for side in "KV"}


def _pack_input(
    buffer: torch.Tensor, loc: torch.Tensor, x: torch.Tensor, spec: QuantSpec, planes: bool
) -> torch.Tensor:
    """``x`` checked against the pack into ``buffer``; contiguous along D (copied only where
    its last dim is strided)."""
    if x.dim() != 3 or x.dtype not in _FLOATS:
        raise ValueError(f"x must be fp16/bf16/fp32 [N, heads, D], got {x.dtype} {tuple(x.shape)}")
    _check(buffer, loc, spec, x.shape[2], planes)
    if x.shape[0] != loc.shape[0] or x.shape[1] != buffer.shape[1] or x.device != buffer.device:
        raise ValueError(
            f"x must be [len(loc)={loc.shape[0]}, heads={buffer.shape[1]}, D] on {buffer.device}, "
            f"got {tuple(x.shape)} on {x.device}"
        )
    return x if x.stride(2) == 1 else x.contiguous()


def _pack_plan(spec: QuantSpec, tokens: int, heads: int, sms: int | None) -> PoolPlan:
    """:func:`plan_pool`'s pack plan for a launch of ``tokens`` × ``heads`` rows on ``sms``."""
    return plan_pool(spec, pack=True).filling(tokens, heads, sms)


def triton_gather_dequantized(
    buffer: torch.Tensor,
    loc: torch.Tensor,
    spec: QuantSpec,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    *,
    plan: PoolPlan | None = None,
    planes: bool = False,
) -> torch.Tensor:
    """``dequantize(buffer[loc], spec, head_dim, dtype)`` -> [N, heads, head_dim] (``planes``:
    the buffer laid out as :mod:`.planes`); one kernel launch (the rotation is undone inside
    it). ``plan`` None: :func:`plan_pool`'s."""
    if dtype not in _FLOATS:
        raise ValueError(f"dtype must be one of {_FLOATS}, got {dtype}")
    _check(buffer, loc, spec, head_dim, planes)
    shape = (loc.shape[0], buffer.shape[1], head_dim)
    out = torch.empty(shape, dtype=dtype, device=buffer.device)
    if loc.shape[0] == 0:
        return out
    plan = plan or plan_pool(spec, pack=False)
    grid, args = _launch_args(buffer, loc, spec, head_dim, plan, planes)
    kernel = _gather_kernel if spec.is_quantized else _gather_fp16_kernel
    by_hand = out.dtype == torch.bfloat16 and interpreted()  # a GPU rounds bf16 itself
    target = out.view(torch.int16) if by_hand else out
    kernel[grid](buffer, loc, target, OUT_BF16=by_hand, **args)
    return out
