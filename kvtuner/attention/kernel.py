"""The packed attention kernel, its split reduce, and their launcher.

Grid ``(B, Hkv, query blocks × splits)`` (flash decoding): a program owns one KV head of one
request, a block of its queries and one slice of its packed tokens; it loads each K/V tile once
for all ``Hq / Hkv`` query heads of that KV head (rows = query token × head, padded to at least
16, the smallest ``tl.dot``), keeps an online softmax, and writes a normalized partial output
and its log2-sum-exp. The last split also attends the tail. With a sliding window the splits
cover only the window of the block's queries. :func:`.splits.merge_splits` merges the splits of each
(request, query, head), and adds the head's attention sink to the softmax denominator.

Rows are addressed as ``base + b * stride_b + token * stride_tok + h * stride_head``: a paged
pool ``[slots, Hkv, R]`` has ``stride_b = 0`` and takes ``token`` from the request's slot table;
the HF cache's rows ``[B, Hkv, T, R]`` use ``token = t`` directly. Channel-axis (KIVI) keys
are blocks of G tokens: ``[B, Hkv, T/G, block]`` (HF), or in a pool one block per page of G
slots ``[pages, Hkv, block]`` with the filling pages' fp values staged beside them.

Two variants of the loop over tiles where K and V are both packed (``K_AFTER_DOT`` and
``V_AFTER_DOT``, per operand, chosen by :func:`launch`): element-wise (dequantize each tile,
then ``tl.dot``) or scale-after-dot (:mod:`.after_dot`: dot the raw codes, apply scale and zero
per group after it). The loop over the tail and K/V boundary is element-wise in both.

Pre-RoPE keys (``ROPE_HALF`` > 0, :mod:`.rope`): every K tile, packed or tail, is dequantized
element-wise and rotated forward to its positions (``offset + t``) before its ``tl.dot``; a
rotated tile is no longer codes times a scale, so such keys never run scale-after-dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.intmath import cdiv, next_power_of_2
from ..quant.spec import QuantSpec
from ..quant.triton_codes import meta_offset
from .after_dot import (
    _group_scores,
    _group_tile,
    _group_values,
    _query_groups,
    _spread_groups,
    takes_after_dot,
    wanted,
)
from .layout import AttentionBatch, placeholder
from .rope import kernel_rope
from .splits import merge_splits, softmax_args, split_chunk, store_partial
from .tiles import (
    _channel_tile,
    _dot,
    _kv_tile,
    _paged_channel_tile,
    _rope_tile,
    _softmax_step,
    _stored_tile,
    _visible,
)

__all__ = ["launch"]


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, kt_ptr, vt_ptr, table_ptr, rows_ptr, len_ptr, start_ptr, qo_ptr, o_ptr,
    lse_ptr, ks_ptr, ksr_ptr, freq_ptr, roff_ptr, stride_qb, stride_qt, stride_qh, k_sb, k_st,
    k_sh, v_sb, v_st, v_sh, kt_sb, kt_sh, kt_st, vt_sb, vt_sh, vt_st, ks_sr, ks_sg, ks_sh,
    stride_table, q_len, k_delta, v_tail_len, chunk, num_splits, window, score_scale, cap_log2,
    D: tl.constexpr, GROUP: tl.constexpr, GP: tl.constexpr, BQ: tl.constexpr, BT: tl.constexpr,
    K_BITS: tl.constexpr, K_G: tl.constexpr, K_SYM: tl.constexpr, K_CHANNEL: tl.constexpr,
    V_BITS: tl.constexpr, V_G: tl.constexpr, V_SYM: tl.constexpr, PAGED: tl.constexpr,
    HAS_ROWS: tl.constexpr, HAS_START: tl.constexpr, RAGGED: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr, DOT_IEEE: tl.constexpr, K_AFTER_DOT: tl.constexpr,
    V_AFTER_DOT: tl.constexpr, ROPE_HALF: tl.constexpr, K_PLANES: tl.constexpr,
    V_PLANES: tl.constexpr,
):  # fmt: skip
    b, h = tl.program_id(0), tl.program_id(1)
    qb, split = tl.program_id(2) // num_splits, tl.program_id(2) % num_splits
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    row = tl.load(rows_ptr + b).to(tl.int64) if HAS_ROWS else b64
    v_len = tl.load(len_ptr + b)  # packed V tokens; K has k_delta more (channel blocks)
    k_len = v_len + k_delta
    start = tl.load(start_ptr + b) if HAS_START else 0
    k_pos0 = tl.load(roff_ptr + b) if ROPE_HALF else 0  # pre-RoPE: position of stored key 0
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
    first = tl.min(tl.where(q_ok, qpos, total), 0)
    base = tl.maximum(first - window + 1, 0) if WINDOW else 0  # no row attends keys before it
    m = tl.full([QP], -float("inf"), tl.float32)
    denom = tl.zeros([QP], tl.float32)
    acc = tl.zeros([QP, D], tl.float32)
    k_base, v_base = k_ptr + b64 * k_sb + h64 * k_sh, v_ptr + b64 * v_sb + h64 * v_sh
    kt_base, vt_base = kt_ptr + b64 * kt_sb + h64 * kt_sh, vt_ptr + b64 * vt_sb + h64 * vt_sh
    ks_base = ks_ptr + h64 * ks_sh  # paged channel-axis keys: filling pages' fp values
    heads = tl.num_programs(1)  # grid axis 1: a program a KV head
    k_md = meta_offset(h64, heads, D, K_BITS, K_G, K_SYM, K_PLANES, 1)  # codes to scales, in bytes
    v_md = meta_offset(h64, heads, D, V_BITS, V_G, V_SYM, V_PLANES, 1)
    both = tl.minimum(k_len, v_len)  # below: K and V both packed (the split-K hot loop)
    lo = base + split * chunk
    hi = tl.minimum(tl.minimum(lo + chunk, both), last + 1)
    # above `both`: packed for one of K/V, tail for the other, or tail for both; last split
    end = tl.where(split == num_splits - 1, tl.minimum(total, last + 1), both)
    if K_AFTER_DOT:  # q's key groups [NG, QP, G] and their sums [NG, QP], once
        q_g, q_sum = _query_groups(q, K_G)
    acc_z = tl.zeros([D // V_G if V_AFTER_DOT else 1, QP], tl.float32)  # Σ p·zero [NG, QP]
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        ok = (t < hi) & (t >= start)
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + t, mask=ok, other=0).to(tl.int64)
        else:
            tok = t.to(tl.int64)
        if K_AFTER_DOT:  # codes [BT, NG, G] in q's dtype, scale and zero [NG, BT]
            kc, ks, kz = _group_tile(k_base, tok * k_st, k_md, ok, D, K_BITS, K_G, K_SYM, q.dtype)
        elif K_CHANNEL and PAGED:
            k = _paged_channel_tile(k_base, ks_base, ksr_ptr, tok, ok, k_st, ks_sr, ks_sg, D,
                                    K_BITS, K_G, K_SYM)  # fmt: skip
        elif K_CHANNEL:
            k = _channel_tile(k_base, t, ok, k_st, D, K_BITS, K_G, K_SYM)
        else:
            k = _kv_tile(k_base, tok * k_st, k_md, ok, D, K_BITS, K_G, K_SYM)
        if ROPE_HALF:  # never with K_AFTER_DOT (the launcher's choice)
            k = _rope_tile(k, k_pos0 + t, freq_ptr, ROPE_HALF)
        if V_AFTER_DOT:  # fp16 codes whatever q is: p·scale keeps 11 bits, not bf16's 8
            v_dot = q.dtype if DOT_IEEE else tl.float16
            vc, vs, vz = _group_tile(v_base, tok * v_st, v_md, ok, D, V_BITS, V_G, V_SYM, v_dot)
        else:
            v = _kv_tile(v_base, tok * v_st, v_md, ok, D, V_BITS, V_G, V_SYM)
        seen = _visible(t, ok, qpos, window, WINDOW)
        if K_AFTER_DOT:
            s = _group_scores(q_g, q_sum, kc, ks, kz, DOT_IEEE)
        else:
            s = _dot(q, tl.trans(k.to(q.dtype)), DOT_IEEE)
        m, denom, alpha, p = _softmax_step(s, seen, m, denom, score_scale, cap_log2, SOFTCAP)
        if V_AFTER_DOT:
            pv, pz = _group_values(p, vc, vs, vz, DOT_IEEE)
            acc_z = acc_z * alpha[None, :] + pz
        else:
            pv = _dot(p.to(q.dtype), v.to(q.dtype), DOT_IEEE)
        acc = acc * alpha[:, None] + pv
    for t0 in range(tl.maximum(both, base), end, BT):
        t = t0 + tl.arange(0, BT)
        ok = (t < end) & (t >= start)
        if PAGED:
            tok = tl.load(table_ptr + row * stride_table + t, mask=ok & (t < v_len), other=0)
            tok = tok.to(tl.int64)
        else:
            tok = t.to(tl.int64)
        if K_CHANNEL and PAGED:  # a paged pool has no tail: all packed
            k = _paged_channel_tile(k_base, ks_base, ksr_ptr, tok, ok, k_st, ks_sr, ks_sg, D,
                                    K_BITS, K_G, K_SYM)  # fmt: skip
        else:
            k = _stored_tile(k_base, kt_base, t, tok, ok, k_len, k_st, k_md, kt_st, D, K_BITS, K_G,
                             K_SYM, K_CHANNEL)  # fmt: skip
        if ROPE_HALF:
            k = _rope_tile(k, k_pos0 + t, freq_ptr, ROPE_HALF)
        v = _stored_tile(v_base, vt_base, t, tok, ok, v_len, v_st, v_md, vt_st, D, V_BITS, V_G,
                         V_SYM, False)  # fmt: skip
        seen = _visible(t, ok, qpos, window, WINDOW)  # the tail: element-wise tiles only
        s = _dot(q, tl.trans(k.to(q.dtype)), DOT_IEEE)
        m, denom, alpha, p = _softmax_step(s, seen, m, denom, score_scale, cap_log2, SOFTCAP)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), DOT_IEEE)
        if V_AFTER_DOT:
            acc_z = acc_z * alpha[None, :]
    if V_AFTER_DOT:
        acc += _spread_groups(acc_z, V_G)  # each value group's Σ p·zero on its channels
    hq = GROUP * tl.num_programs(1)
    at = ((q0 + qi) * hq + qh) * num_splits + split  # [rows of q, Hq, splits] index
    store_partial(o_ptr, lse_ptr, at, m, denom, acc, q_ok)


def _rows_view(rows: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """What the kernel indexes: packed uint8 rows, or 16-bit rows as fp16 elements."""
    return rows if spec.is_quantized else rows.view(torch.float16)


def _row_strides(batch: AttentionBatch, name: str) -> tuple[int, ...]:
    """(stride_b, stride_tok, stride_head) of K's (``"k"``) or V's rows in the elements the
    kernel indexes (:func:`_rows_view`: bytes, or fp16 of 16-bit rows)."""
    size = 1 if getattr(batch, f"{name}_spec").is_quantized else 2
    return tuple(s // size for s in batch.row_strides(name))


def _spec_args(spec: QuantSpec, prefix: str) -> dict:
    sym = spec.symmetric if spec.is_quantized else False
    return {f"{prefix}_BITS": spec.bits, f"{prefix}_G": spec.group_size, f"{prefix}_SYM": sym}


def launch(
    batch: AttentionBatch,
    q: torch.Tensor,
    k_tail: torch.Tensor | None,
    v_tail: torch.Tensor | None,
    splits: int,
    block_tokens: int,
    *,
    scale_after_dot: bool | None = None,
    out_dtype: torch.dtype = torch.float32,
    **triton_options: int,
) -> torch.Tensor:
    """Partial outputs of every split, merged: [B, Tq, Hq, D] (ragged: [N, Hq, D]) in
    ``out_dtype``.
    ``q`` and the tails as the kernel reads them (rotated, smoothed); the rest from ``batch``.

    ``scale_after_dot`` picks the kernel variant (None: the environment variable
    ``KVTUNER_SCALE_AFTER_DOT``, "1" for on; unset: off). Off: every tile is dequantized
    element-wise before its ``tl.dot``. On: quantized token-axis K/V rows with groups >= 16
    channels dot their raw codes and apply scale and zero per group after the dot
    (:mod:`.after_dot`); channel-axis keys, groups < 16, 16-bit rows, unpacked tails and
    pre-RoPE keys (rotated per tile, :mod:`.rope`) stay element-wise. ``triton_options``
    (``num_warps``, ``num_stages``) go to the attention kernel's launch."""
    bsz, q_len, hq, dim = batch.batch_size, batch.q_tokens, q.shape[-2], batch.head_dim
    ragged, paged = batch.qo_indptr is not None, batch.slot_table is not None
    hkv, group = batch.kv_heads, hq // batch.kv_heads
    gp = next_power_of_2(group)
    bq = min(next_power_of_2(q_len), max(1, 64 // gp))  # about 64 rows per program
    chunk, splits = split_chunk(batch, splits, block_tokens)
    dev = q.device
    rows_of_q = q.shape[0] if ragged else bsz * q_len  # one per query token
    partial = torch.empty(rows_of_q, hq, splits, dim, dtype=torch.float32, device=dev)
    lse = torch.empty(rows_of_q, hq, splits, dtype=torch.float32, device=dev)
    k_rows, v_rows = _rows_view(batch.k_rows, batch.k_spec), _rows_view(batch.v_rows, batch.v_spec)
    empty = placeholder(q, dim)  # no tail, no KIVI stage: pointers never read
    k_tail, v_tail = (empty, empty) if k_tail is None else (k_tail, v_tail)
    table = batch.slot_table if paged else batch.lengths  # unused pointers: any int tensor
    rows = batch.table_rows if batch.table_rows is not None else batch.lengths
    starts = batch.starts if batch.starts is not None else batch.lengths
    qo = batch.qo_indptr if ragged else batch.lengths
    stage = batch.k_stage if batch.k_stage is not None else empty  # [rows, G, Hkv, D]
    stage_rows = batch.k_stage_rows if batch.k_stage_rows is not None else batch.lengths
    q_strides = (0, *q.stride()[:2]) if ragged else q.stride()[:3]  # (b, token, head)
    on = wanted(scale_after_dot)
    freq, k_pos0, rope_half = kernel_rope(batch)  # pre-RoPE keys: K tiles element-wise
    _attention_kernel[(bsz, hkv, cdiv(q_len, bq) * splits)](
        q, k_rows, v_rows, k_tail, v_tail, table, rows, batch.lengths, starts, qo, partial, lse,
        stage, stage_rows, freq, k_pos0, *q_strides, *_row_strides(batch, "k"),
        *_row_strides(batch, "v"), *k_tail.stride()[:3], *v_tail.stride()[:3],
        stage.stride(0), stage.stride(1), stage.stride(2), table.stride(0) if paged else 0,
        q_len, batch.k_delta, batch.v_tail_tokens, chunk, splits, **softmax_args(batch), D=dim,
        GROUP=group, GP=gp, BQ=bq, BT=block_tokens, **_spec_args(batch.k_spec, "K"),
        K_CHANNEL=batch.k_spec.axis == "channel" and batch.k_spec.is_quantized,
        **_spec_args(batch.v_spec, "V"), PAGED=paged, HAS_ROWS=batch.table_rows is not None,
        HAS_START=batch.starts is not None, RAGGED=ragged, DOT_IEEE=q.dtype == torch.float32,
        K_AFTER_DOT=takes_after_dot(batch.k_spec, on and not rope_half),
        V_AFTER_DOT=takes_after_dot(batch.v_spec, on), ROPE_HALF=rope_half,
        K_PLANES=batch.in_planes("k"), V_PLANES=batch.in_planes("v"), **triton_options,
    )  # fmt: skip
    out = merge_splits(partial, lse, batch.sinks, out_dtype)
    return out if ragged else out.view(bsz, q_len, hq, dim)
