"""Fused attention over packed KV rows (decode and extend): one Triton kernel, its split
reduce, the launchers.

``q [B, Tq, Hq, D]``: each request's newest Tq tokens (decode: Tq = 1), already stored, attend
causally to one layer's packed K and V rows and an optional unpacked tail. Codes, scales and
zeros are read and dequantized in registers (never written back), scores and the softmax run in
fp32, and the dot products run in q's dtype (what dequantize-then-SDPA does).

Grid ``(B, Hkv, query blocks × splits)`` (flash decoding): a program owns one KV head of one
request, a block of its queries and one slice of its packed tokens; it loads each K/V tile once
for all ``Hq / Hkv`` query heads of that KV head (rows = query token × head, padded to at least
16, the smallest ``tl.dot``), keeps an online softmax, and writes a normalized partial output
and its log2-sum-exp. The last split also attends the tail. ``_reduce_kernel`` merges the
splits of each (request, query, head).

Rows are addressed as ``base + b * stride_b + token * stride_tok + h * stride_head``: a paged
pool ``[slots, Hkv, R]`` has ``stride_b = 0`` and takes ``token`` from the request's slot table;
the HF cache's rows ``[B, Hkv, T, R]`` use ``token = t`` directly. Hadamard-rotated keys are
attended by rotating q, rotated values by un-rotating the output (both in the launcher).
Smoothed keys (rows of ``k / λ``, :mod:`kvtuner.quant.smoothing`) are attended by multiplying q
by λ (and dividing the unpacked tail by it): ``q·k = (q ⊙ λ)·(k / λ)``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..quant.reference import hadamard
from ..quant.smoothing import smooth, unsmooth
from ..quant.spec import QuantSpec
from ..quant.triton_kernels import _load_codes, _load_fp16, interpreted
from .layout import AttentionBatch, choose_splits

__all__ = ["decode_attention", "extend_attention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _kv_tile(ptr, off, ok, D: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
             SYM: tl.constexpr):  # fmt: skip
    """Rows at ``ptr + off`` ([BT] element offsets; ``ok`` masks them) -> fp32 [BT, D].
    16 bits: ``ptr`` is fp16 elements; else uint8 packed rows (codes, scales, zeros)."""
    BT: tl.constexpr = off.shape[0]
    if BITS == 16:
        d = tl.arange(0, D)
        return tl.load(ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    NB: tl.constexpr = D * BITS // 8
    NG: tl.constexpr = D // G
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    src = ptr + off
    codes = tl.reshape(_load_codes(src, ok, NB, D // 8, BITS), [BT, NG, G])
    meta = src[:, None] + NB + 2 * tl.arange(0, NG)[None, :]  # [BT, NG] fp16 scale bytes
    scale = _load_fp16(meta, ok[:, None])[:, :, None]  # once per group and row
    if SYM:
        vals = tl.math.div_rn((codes - HALF) * scale, HALF * 1.0)
    else:
        vals = _load_fp16(meta + 2 * NG, ok[:, None])[:, :, None] + codes * scale
    return tl.reshape(vals, [BT, D])


@triton.jit
def _channel_tile(base, t, ok, stride_block, D: tl.constexpr, BITS: tl.constexpr,
                  G: tl.constexpr, SYM: tl.constexpr):  # fmt: skip
    """Tokens t [BT] of channel-axis blocks at ``base`` (block i at ``i * stride_block``: the
    codes of G tokens, then D scales, D zeros) -> fp32 [BT, D]."""
    BT: tl.constexpr = t.shape[0]
    NB: tl.constexpr = D * BITS // 8  # code bytes of one token in a block
    HALF: tl.constexpr = (1 << (BITS - 1)) - 1
    block = base + (t // G).to(tl.int64) * stride_block  # [BT]
    codes = tl.reshape(_load_codes(block + (t % G) * NB, ok, NB, D // 8, BITS), [BT, D])
    meta = block[:, None] + G * NB + 2 * tl.arange(0, D)[None, :]  # [BT, D] scale bytes
    scale = _load_fp16(meta, ok[:, None])
    if SYM:
        return tl.math.div_rn((codes - HALF) * scale, HALF * 1.0)
    return _load_fp16(meta + 2 * D, ok[:, None]) + codes * scale


@triton.jit
def _stored_tile(base, tail, t, tok, ok, packed, stride_tok, stride_tail, D: tl.constexpr,
                 BITS: tl.constexpr, G: tl.constexpr, SYM: tl.constexpr,
                 CHANNEL: tl.constexpr):  # fmt: skip
    """Positions t [BT] of one K or V: packed rows below ``packed`` tokens, the tail (rows at
    ``tail + i * stride_tail``) from there on -> fp32 [BT, D]."""
    in_rows = ok & (t < packed)
    if CHANNEL:
        x = _channel_tile(base, t, in_rows, stride_tok, D, BITS, G, SYM)
    else:
        x = _kv_tile(base, tok * stride_tok, in_rows, D, BITS, G, SYM)
    in_tail = (ok & (t >= packed))[:, None]
    at = tail + (t - packed).to(tl.int64)[:, None] * stride_tail + tl.arange(0, D)[None, :]
    return tl.where(in_tail, tl.load(at, mask=in_tail, other=0.0).to(tl.float32), x)


@triton.jit
def _attend(q, k, v, ok, m, denom, acc, sm_scale_log2, DOT_IEEE: tl.constexpr):
    """One tile of the online softmax: q [QP, D], k/v fp32 [BT, D], ok [QP, BT]."""
    if DOT_IEEE:
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k.to(q.dtype)))
    s = tl.where(ok, s * sm_scale_log2, -float("inf"))  # [QP, BT], log2 units
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # nothing seen yet: no rescale
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    denom = denom * alpha + tl.sum(p, 1)
    if DOT_IEEE:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision="ieee")
    else:
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, denom, acc * alpha[:, None] + pv


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, kt_ptr, vt_ptr, table_ptr, rows_ptr, len_ptr, start_ptr, qo_ptr, o_ptr,
    lse_ptr, stride_qb, stride_qt, stride_qh, k_sb, k_st, k_sh, v_sb, v_st, v_sh, kt_sb, kt_sh,
    kt_st, vt_sb, vt_sh, vt_st, stride_table, q_len, k_delta, v_tail_len, chunk, num_splits,
    sm_scale_log2, D: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, BQ: tl.constexpr,
    BT: tl.constexpr, K_BITS: tl.constexpr, K_G: tl.constexpr, K_SYM: tl.constexpr,
    K_CHANNEL: tl.constexpr, V_BITS: tl.constexpr, V_G: tl.constexpr, V_SYM: tl.constexpr,
    PAGED: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_START: tl.constexpr,
    RAGGED: tl.constexpr, DOT_IEEE: tl.constexpr,
):  # fmt: skip
    b, h = tl.program_id(0), tl.program_id(1)
    qb, split = tl.program_id(2) // num_splits, tl.program_id(2) % num_splits
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    row = tl.load(rows_ptr + b).to(tl.int64) if HAS_ROWS else b64
    v_len = tl.load(len_ptr + b)  # packed V tokens; K has k_delta more (channel blocks)
    k_len = v_len + k_delta
    start = tl.load(start_ptr + b) if HAS_START else 0
    if RAGGED:  # q [N, Hq, D]: request b's queries are rows qo[b]:qo[b+1]
        q0 = tl.load(qo_ptr + b).to(tl.int64)
        n_q = tl.load(qo_ptr + b + 1).to(tl.int64) - q0
    else:
        q0 = b64 * q_len
        n_q = q_len
    QP: tl.constexpr = BQ * GP if BQ * GP >= 16 else 16  # rows: (query token, head of group)
    r, d = tl.arange(0, QP), tl.arange(0, D)
    qi = qb * BQ + r // GP  # query token of each row
    qh = h64 * GROUP + r % GP  # its query head
    q_ok = (r % GP < GROUP) & (qi < n_q) & (r < BQ * GP)
    q_row = qi.to(tl.int64) + q0 if RAGGED else qi.to(tl.int64)  # stride_qb is 0 if RAGGED
    q_at = q_ptr + b64 * stride_qb + q_row[:, None] * stride_qt
    q = tl.load(q_at + qh[:, None] * stride_qh + d[None, :], mask=q_ok[:, None], other=0.0)
    total = v_len + v_tail_len
    qpos = total - n_q + qi  # global position: the queries are the last tokens
    last = tl.max(tl.where(q_ok, qpos, -1), 0)  # keys past this one no row of ours attends
    m = tl.full([QP], -float("inf"), tl.float32)
    denom = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    k_base, v_base = k_ptr + b64 * k_sb + h64 * k_sh, v_ptr + b64 * v_sb + h64 * v_sh
    kt_base, vt_base = kt_ptr + b64 * kt_sb + h64 * kt_sh, vt_ptr + b64 * vt_sb + h64 * vt_sh
    both = tl.minimum(k_len, v_len)  # below: K and V both packed (the split-K hot loop)
    lo = split * chunk
    hi = tl.minimum(tl.minimum(lo + chunk, both), last + 1)
    # above `both`: packed for one of K/V, tail for the other, or tail for both; last split
    end = tl.where(split == num_splits - 1, tl.minimum(total, last + 1), both)
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        ok = (t < hi) & (t >= start)
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + t, mask=ok, other=0).to(tl.int64)
        else:
            tok = t.to(tl.int64)
        if K_CHANNEL:
            k = _channel_tile(k_base, t, ok, k_st, D, K_BITS, K_G, K_SYM)
        else:
            k = _kv_tile(k_base, tok * k_st, ok, D, K_BITS, K_G, K_SYM)
        v = _kv_tile(v_base, tok * v_st, ok, D, V_BITS, V_G, V_SYM)
        causal = ok[None, :] & (t[None, :] <= qpos[:, None])
        m, denom, acc = _attend(q, k, v, causal, m, denom, acc, sm_scale_log2, DOT_IEEE)
    for t0 in range(both, end, BT):
        t = t0 + tl.arange(0, BT)
        ok = (t < end) & (t >= start)
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + t, mask=ok & (t < v_len), other=0)
            tok = tok.to(tl.int64)
        else:
            tok = t.to(tl.int64)
        k = _stored_tile(k_base, kt_base, t, tok, ok, k_len, k_st, kt_st, D, K_BITS, K_G, K_SYM,
                         K_CHANNEL)  # fmt: skip
        v = _stored_tile(v_base, vt_base, t, tok, ok, v_len, v_st, vt_st, D, V_BITS, V_G, V_SYM,
                         False)  # fmt: skip
        causal = ok[None, :] & (t[None, :] <= qpos[:, None])
        m, denom, acc = _attend(q, k, v, causal, m, denom, acc, sm_scale_log2, DOT_IEEE)
    seen = denom > 0
    out = acc / tl.where(seen, denom, 1.0)[:, None]
    lse = tl.where(seen, m + tl.log2(tl.where(seen, denom, 1.0)), -float("inf"))
    hq = GROUP * tl.num_programs(1)
    at = ((q0 + qi) * hq + qh) * num_splits + split  # [rows of q, Hq, splits] index
    tl.store(lse_ptr + at, lse, mask=q_ok)
    tl.store(o_ptr + at[:, None] * D + d[None, :], out, mask=q_ok[:, None])


@triton.jit
def _reduce_kernel(o_ptr, lse_ptr, out_ptr, num_splits, D: tl.constexpr, S_PAD: tl.constexpr):
    """Merge the splits of one (request, query, head): softmax-weighted by their log2-sum-exp."""
    bh = tl.program_id(0).to(tl.int64)
    s, d = tl.arange(0, S_PAD), tl.arange(0, D)
    ok = s < num_splits
    lse = tl.load(lse_ptr + bh * num_splits + s, mask=ok, other=-float("inf"))
    top = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(top == -float("inf"), 0.0, top))  # empty splits weigh 0
    o = tl.load(
        o_ptr + (bh * num_splits + s)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + bh * D + d, out)


def _rows_view(rows: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """What the kernel indexes: packed uint8 rows, or 16-bit rows as fp16 elements."""
    return rows if spec.is_quantized else rows.view(torch.float16)


def _row_strides(rows: torch.Tensor, paged: bool) -> tuple[int, int, int]:
    """(stride_b, stride_tok, stride_head) of ``[slots, Hkv, R]`` or ``[B, Hkv, T, R]``."""
    if paged:
        return 0, rows.stride(0), rows.stride(1)
    return rows.stride(0), rows.stride(2), rows.stride(1)


def _spec_args(spec: QuantSpec, prefix: str) -> dict:
    sym = spec.symmetric if spec.is_quantized else False
    return {f"{prefix}_BITS": spec.bits, f"{prefix}_G": spec.group_size, f"{prefix}_SYM": sym}


def _rotated(x: torch.Tensor | None, spec: QuantSpec) -> torch.Tensor | None:
    if x is None or spec.rotation != "hadamard" or not spec.is_quantized:
        return x
    return (x.float() @ hadamard(x.shape[-1], x.device)).to(x.dtype)


def _smoothed(q: torch.Tensor, k_tail: torch.Tensor | None, lam: torch.Tensor | None):
    """q [B, Tq, Hq, D] or ragged [N, Hq, D] times λ [Hkv, D] (each query head its KV head's
    row) and the key tail
    [B, Hkv, Tt, D] divided by it; both unchanged without λ."""
    if lam is None:
        return q, k_tail
    per_q_head = lam.repeat_interleave(q.shape[-2] // lam.shape[0], dim=0)  # [Hq, D]
    q = unsmooth(q, per_q_head, -2, q.dtype)
    if k_tail is not None:
        k_tail = smooth(k_tail, lam, -3).to(k_tail.dtype)
    return q, k_tail


def _launch(batch: AttentionBatch, splits: int, block_tokens: int) -> torch.Tensor:
    """Partial outputs of every split, merged: fp32 [B, Tq, Hq, D] (in V's rotated basis)."""
    q, k_spec, v_spec = batch.q, batch.k_spec, batch.v_spec
    bsz, q_len, hq, dim = batch.batch_size, batch.q_tokens, q.shape[-2], batch.head_dim
    ragged = batch.qo_indptr is not None
    hkv, group = batch.kv_heads, hq // batch.kv_heads
    gp = triton.next_power_of_2(group)
    bq = min(triton.next_power_of_2(q_len), max(1, 64 // gp))  # about 64 rows per program
    q_blocks = triton.cdiv(q_len, bq)
    width = batch.max_packed
    chunk = triton.cdiv(triton.cdiv(max(width, 1), splits), block_tokens) * block_tokens
    splits = max(1, triton.cdiv(width, chunk))
    dev = q.device
    rows_of_q = q.shape[0] if ragged else bsz * q_len  # one per query token
    partial = torch.empty(rows_of_q, hq, splits, dim, dtype=torch.float32, device=dev)
    lse = torch.empty(rows_of_q, hq, splits, dtype=torch.float32, device=dev)
    k_rows, v_rows = _rows_view(batch.k_rows, k_spec), _rows_view(batch.v_rows, v_spec)
    paged = batch.slot_table is not None
    q, k_tail = _smoothed(q, batch.k_tail, batch.k_smooth)
    k_tail, v_tail = _rotated(k_tail, k_spec), _rotated(batch.v_tail, v_spec)
    empty = torch.zeros(1, 1, 1, dim, dtype=q.dtype, device=dev)
    k_tail, v_tail = (empty, empty) if k_tail is None else (k_tail, v_tail)
    table = batch.slot_table if paged else batch.lengths  # unused pointers: any int tensor
    rows = batch.table_rows if batch.table_rows is not None else batch.lengths
    starts = batch.starts if batch.starts is not None else batch.lengths
    sm_scale = batch.sm_scale if batch.sm_scale is not None else dim**-0.5
    q = _rotated(q, k_spec)
    if q.dtype == torch.bfloat16 and not q.is_cuda:
        q = q.float()  # Triton's interpreter has no bf16 tl.dot (numpy has no bf16): fp32 dots
    qo = batch.qo_indptr if ragged else batch.lengths
    q_strides = (0, *q.stride()[:2]) if ragged else q.stride()[:3]  # (b, token, head)
    _attention_kernel[(bsz, hkv, q_blocks * splits)](
        q, k_rows, v_rows, k_tail, v_tail, table, rows, batch.lengths, starts, qo, partial, lse,
        *q_strides, *_row_strides(k_rows, paged),
        *_row_strides(v_rows, paged), k_tail.stride(0), k_tail.stride(1), k_tail.stride(2),
        v_tail.stride(0), v_tail.stride(1), v_tail.stride(2), table.stride(0) if paged else 0,
        q_len, batch.k_delta, batch.v_tail_tokens, chunk, splits, sm_scale * _LOG2E, D=dim,
        GROUP=group, GP=gp, BQ=bq, BT=block_tokens, **_spec_args(k_spec, "K"),
        K_CHANNEL=k_spec.axis == "channel" and k_spec.is_quantized, **_spec_args(v_spec, "V"),
        PAGED=paged, HAS_ROWS=batch.table_rows is not None, HAS_START=batch.starts is not None,
        RAGGED=ragged, DOT_IEEE=q.dtype == torch.float32,
    )  # fmt: skip
    out = torch.empty(rows_of_q, hq, dim, dtype=torch.float32, device=dev)
    s_pad = triton.next_power_of_2(splits)
    _reduce_kernel[(rows_of_q * hq,)](partial, lse, out, splits, D=dim, S_PAD=s_pad)
    return out if ragged else out.view(bsz, q_len, hq, dim)


def extend_attention(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    *,
    lengths: torch.Tensor | None = None,
    slot_table: torch.Tensor | None = None,
    table_rows: torch.Tensor | None = None,
    k_tail: torch.Tensor | None = None,
    v_tail: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
    sm_scale: float | None = None,
    qo_indptr: torch.Tensor | None = None,
    max_q_len: int | None = None,
    num_splits: int | None = None,
    block_tokens: int = 64,
    k_smooth: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each request's newest Tq tokens over its packed K/V (and tail)
    -> [B, Tq, Hq, D] (ragged: [N, Hq, D]) in q's dtype.

    q: [B, Tq, Hq, D] (Hq a multiple of the KV heads): the last Tq positions of every request,
    already stored (packed, or in the tail); query i attends positions <= ``total - Tq + i``.
    Rows, one layer's K (``k_spec``) and V:
    - paged: ``k_rows [slots, Hkv, R]``, ``slot_table [rows, W]`` (int32/int64; request b's
      token t lives in slot ``slot_table[table_rows[b], t]``, ``table_rows`` default
      ``arange(B)``), ``lengths [B]`` int32 packed tokens (required);
    - contiguous (HF cache): ``k_rows [B, Hkv, T, R]``, ``lengths`` default T for all.
    k_tail / v_tail: optional unpacked tokens ``[B, Hkv, Tt, D]`` after the packed ones.
    starts: optional int32 [B]: the request attends positions >= starts[b] (left padding).
    Ragged batches (paged only; SGLang's extend): q ``[N, Hq, D]``, ``qo_indptr [B+1]`` int32
    (request b's queries are rows ``qo_indptr[b]:qo_indptr[b+1]``, its newest tokens) and
    ``max_q_len`` (host int >= every request's count; it sizes the grid, no device sync).
    k_smooth: optional fp32 λ [Hkv, D]: the key rows hold ``k / λ`` (the tail holds k).
    num_splits (default: from the device, batch and length) and block_tokens tune the launch.
    Needs CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``.
    """
    batch = AttentionBatch(q, k_rows, v_rows, k_spec, v_spec, lengths, slot_table, table_rows,
                           k_tail, v_tail, starts, sm_scale, qo_indptr, max_q_len,
                           k_smooth)  # fmt: skip
    if not q.is_cuda and not interpreted():
        raise ValueError("packed attention needs CUDA tensors, or TRITON_INTERPRET=1 on CPU")
    if block_tokens < 16 or block_tokens & (block_tokens - 1):
        raise ValueError(f"block_tokens must be a power of two >= 16, got {block_tokens}")
    programs = batch.batch_size * batch.q_tokens  # about: rows of queries per KV head
    splits = num_splits or choose_splits(programs, batch.kv_heads, batch.max_packed, q.device)
    out = _launch(batch, splits, block_tokens)
    if v_spec.is_quantized and v_spec.rotation == "hadamard":
        out = out @ hadamard(q.shape[-1], q.device)  # back from V's rotated basis
    return out.to(q.dtype)


def decode_attention(q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """One query token per request, q [B, Hq, D] -> [B, Hq, D]: :func:`extend_attention` with
    Tq = 1 (the query attends every stored position), same arguments."""
    if q.dim() != 3:
        raise ValueError(f"decode q must be [B, Hq, D], got {tuple(q.shape)}")
    return extend_attention(q.unsqueeze(1), *args, **kwargs).squeeze(1)
