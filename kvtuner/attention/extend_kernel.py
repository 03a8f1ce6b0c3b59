"""The extend kernel: SGLang's ragged extend batch (each request's new tokens, already in the
pool, attend causally to everything stored) over token-axis packed K/V rows, and its launcher.

Grid ``(B, Hkv, query blocks × splits)``: a program owns one KV head of one request, a block of
``BQ`` of its new tokens and one slice of the packed positions those tokens see; rows of its
``tl.dot`` are (query token, query head of the KV head), so each K/V tile is loaded once for all
of them. The rows are read as the decode kernel reads them (:mod:`.packed_rows`), causally per
row. With the new tokens in hand (``HAND``: K and V as the model computed them, one row a query
row) only the prefix comes from packed rows: the new positions are read from those values,
exact, by the same online softmax (:func:`_hand_part`), as SGLang's own extend reads them.
KIVI keys in a pool's pages are read a page a tile as the decode kernel reads them: full pages'
blocks in the splits' programs, the filling page's staged values in one more program.
Partials merge in :func:`.splits.merge_splits` (sinks there). Everything else an extend can be
(KIVI pages with a window, pre-RoPE keys, contiguous rows, left padding) runs the general
kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..quant.intmath import cdiv, next_power_of_2
from ..quant.triton_codes import meta_offset
from .layout import AttentionBatch, placeholder
from .packed_rows import (
    _seen,
    decodable,
    dot_operand,
    keys_decodable,
    kivi_keys,
    narrow_offsets,
    packed_part,
    page_tile,
    rows_args,
    table_rows,
    wide_rows,
)
from .splits import merge_splits, softmax_args, split_chunk, store_partial
from .tiles import _dot, _softmax_step

__all__ = ["ExtendPlan", "launch_extend", "plan_extend", "serves_extend"]


@triton.jit
def _extend_kernel(
    q_ptr, k_words, k_half, v_words, v_half, table_ptr, rows_ptr, len_ptr, qo_ptr, o_ptr, lse_ptr,
    k_new, v_new, stage_ptr, srows_ptr, stride_qn, stride_qh, k_st, k_sh, v_st, v_sh,
    stride_table, k_nn, k_nh, v_nn, v_nh, s_sr, s_sg, s_sh, chunk, num_splits, window,
    score_scale, cap_log2, D: tl.constexpr, GROUP: tl.constexpr,
    GP: tl.constexpr, BQ: tl.constexpr, BT: tl.constexpr, K_BITS: tl.constexpr,
    K_G: tl.constexpr, K_SYM: tl.constexpr, K_VEC: tl.constexpr, V_BITS: tl.constexpr,
    V_G: tl.constexpr, V_SYM: tl.constexpr, V_VEC: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr, HAND: tl.constexpr, DOT_IEEE: tl.constexpr, K_CHANNEL: tl.constexpr,
    K_PLANES: tl.constexpr, V_PLANES: tl.constexpr, NARROW: tl.constexpr,
):  # fmt: skip
    b, h = tl.program_id(0), tl.program_id(1)
    parts = num_splits + 1 if K_CHANNEL else num_splits  # KIVI: the filling page's program last
    qb, split = tl.program_id(2) // parts, tl.program_id(2) % parts
    h64 = h.to(tl.int64)
    DT: tl.constexpr = tl.float32 if DOT_IEEE else tl.float16
    q0 = tl.load(qo_ptr + b).to(tl.int64)  # request b's new tokens: q rows q0 .. q0 + n_q
    n_q = tl.load(qo_ptr + b + 1).to(tl.int64) - q0
    QP: tl.constexpr = BQ * GP if BQ * GP >= 16 else 16  # rows: (new token, head of the group)
    r, d = tl.arange(0, QP), tl.arange(0, D)
    qi = qb * BQ + r // GP
    qh = h64 * GROUP + r % GP
    q_ok = (r % GP < GROUP) & (qi < n_q) & (r < BQ * GP)
    q_at = q_ptr + (q0 + qi)[:, None] * stride_qn + qh[:, None] * stride_qh + d[None, :]
    q = dot_operand(tl.load(q_at, mask=q_ok[:, None], other=0.0), DT)  # [QP, D]
    total = tl.load(len_ptr + b)  # stored tokens, the new ones last
    qpos = total - n_q + qi  # [QP]
    last = tl.max(tl.where(q_ok, qpos, -1), 0)  # no row of ours attends past it
    first = tl.min(tl.where(q_ok, qpos, total), 0)
    base = tl.maximum(first - window + 1, 0) if WINDOW else 0  # nor before this
    lo = base + split * chunk
    hi = tl.minimum(tl.minimum(lo + chunk, total), last + 1)
    row = tl.load(rows_ptr + b).to(tl.int64)
    prefix = total - n_q  # positions from here on are the new tokens
    known = prefix if HAND else total  # positions read from the pool end here
    k_at0, v_at0 = h64 * k_sh * K_VEC, h64 * v_sh * V_VEC
    heads = tl.num_programs(1)  # grid axis 1: a program a KV head
    k_md = meta_offset(h64, heads, D, K_BITS, K_G, K_SYM, K_PLANES, 4)  # codes to scales, in words
    v_md = meta_offset(h64, heads, D, V_BITS, V_G, V_SYM, V_PLANES, 4)
    # KIVI keys: the splits read full pages' blocks, one more program the filling page's staging
    pages = (stage_ptr, srows_ptr, s_sr, s_sg, h64 * s_sh) if K_CHANNEL else 0
    full = total // K_G * K_G if K_CHANNEL else total  # positions in full pages (or rows)
    if not K_CHANNEL or split < num_splits:
        m, denom, acc = packed_part(
            q, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0, k_st, v_st, k_md,
            v_md, stride_table, lo, tl.minimum(tl.minimum(hi, known), full), qpos, window,
            score_scale, cap_log2, 0, pages, D, BT, K_BITS, K_G, K_SYM, K_VEC, V_BITS, V_G, V_SYM,
            V_VEC, True, WINDOW, SOFTCAP, True, DOT_IEEE, 0, 1 if K_CHANNEL else 0, False, NARROW,
        )  # fmt: skip
    else:  # the filling page's program
        m, denom, acc = packed_part(
            q, k_words, k_half, v_words, v_half, table_ptr, row, k_at0, v_at0, k_st, v_st, k_md,
            v_md, stride_table, full, tl.minimum(last + 1, known), qpos, window, score_scale,
            cap_log2, 0, pages, D, BT, K_BITS, K_G, K_SYM, K_VEC, V_BITS, V_G, V_SYM, V_VEC, True,
            WINDOW, SOFTCAP, True, DOT_IEEE, 0, 2, False, NARROW,
        )  # fmt: skip
    if HAND and split < num_splits:  # row q0 + i of k_new / v_new is position prefix + i
        m, denom, acc = _hand_part(
            q, m, denom, acc, k_new + (q0 - prefix) * k_nn + h64 * k_nh,
            v_new + (q0 - prefix) * v_nn + h64 * v_nh, k_nn, v_nn, tl.maximum(lo, prefix), hi,
            qpos, window, score_scale, cap_log2, BT, WINDOW, SOFTCAP, DOT_IEEE,
        )  # fmt: skip
    at = ((q0 + qi) * (GROUP * tl.num_programs(1)) + qh) * parts + split  # [N, Hq, parts]
    store_partial(o_ptr, lse_ptr, at, m, denom, acc, q_ok)


@triton.jit
def _hand_part(q, m, denom, acc, k_at, v_at, k_nn, v_nn, lo, hi, qpos, window, score_scale,
               cap_log2, BT: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
               IEEE: tl.constexpr):  # fmt: skip
    """The online softmax (m, denom [QP], acc [QP, D] channel order) carried on over positions
    [lo, hi) whose K and V are float rows in hand (position t at ``k_at + t·k_nn``: the kernel
    shifts the pointers so), causally per row like :func:`.packed_rows.packed_part`. Rows of
    any float dtype become q's as q did (:func:`.packed_rows.dot_operand`)."""
    D: tl.constexpr = q.shape[1]
    d = tl.arange(0, D)
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        ok = t < hi
        tok = tl.minimum(t, hi - 1).to(tl.int64)  # past the end: the last row again, masked
        k = dot_operand(tl.load(k_at + tok[:, None] * k_nn + d[None, :]), q.dtype)  # [BT, D]
        seen = _seen(t, ok, qpos, window, WINDOW, True)
        m, denom, alpha, p = _softmax_step(_dot(q, tl.trans(k), IEEE), seen, m, denom,
                                           score_scale, cap_log2, SOFTCAP)  # fmt: skip
        v = dot_operand(tl.load(v_at + tok[:, None] * v_nn + d[None, :]), q.dtype)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v, IEEE)
    return m, denom, acc


@dataclass(frozen=True)
class ExtendPlan:
    """How one extend launch is cut: position splits, rows a program (query tokens × the KV
    head's query heads, padded to a power of two), tokens a tile, Triton's warps and stages."""

    splits: int
    rows: int = 16
    block_tokens: int = 32
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("rows", "block_tokens"):
            n = getattr(self, name)
            if n < 16 or n & (n - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {n}")
        if self.splits < 1 or self.num_warps not in (1, 2, 4, 8) or self.num_stages < 1:
            raise ValueError(f"need splits >= 1, 1/2/4/8 warps and stages >= 1: {self}")


def plan_extend(batch: AttentionBatch, splits: int) -> ExtendPlan:
    """Tiles as timed on an H200 (``scripts/gpu_session.sh plans``: 16 requests × 8192 stored,
    128 new; docs/results/gpu.md), where K and V are :func:`.packed_rows.wide_rows` at d <=
    128 (KIVI keys aside), 64 tokens a tile:
    - rows loading 16 bytes at a time, codes under 8 bits: 128 query rows on 8 warps (KV4 g32:
      1.05× bf16 SDPA, from 0.28× at 16 rows; 232 registers, no spill);
    - else 64 rows on 4 warps (KV8 g64: 0.83×, from 0.05×, and 0.48× at 128 rows on 8 warps;
      251 registers, no spill; as planes its codes load 16 bytes at a time, its tile stays
      until timed so);
    - K and V of different widths: 64 rows on 8 warps (the sm_90a build: K8V4, K4V8 and K16V4
      spill on 4 warps; not yet timed);
    rows cut to the batch's queries × its query heads (4 warps below the cap), so short
    extends stay decode-sized. Else, as the sm_90a build reads best: 16 rows and 32 tokens on
    4 warps, 2 stages, where rows load 16 bytes at a time; else 16 tokens on 8 warps."""
    vec = min(batch.k_vec, batch.v_vec)
    k, v = batch.k_spec, batch.v_spec
    if batch.head_dim <= 128 and wide_rows(k, v) and not kivi_keys(batch):
        cap = 128 if vec == 4 and k.bits == v.bits < 8 else 64
        group = next_power_of_2(batch.q.shape[-2] // batch.kv_heads)
        rows = max(16, min(cap, next_power_of_2(batch.q_tokens * group)))
        warps = 8 if rows == cap and (cap == 128 or k.bits != v.bits) else 4
        return ExtendPlan(splits, rows=rows, block_tokens=64, num_warps=warps, num_stages=2)
    if vec == 4:
        return ExtendPlan(splits, rows=16, block_tokens=32, num_warps=4, num_stages=2)
    return ExtendPlan(splits, rows=16, block_tokens=16, num_warps=8, num_stages=2)


def serves_extend(batch: AttentionBatch) -> bool:
    """Whether :func:`launch_extend` runs this batch: queries over a paged pool (SGLang's ragged
    extend, or Tq a request), token-axis (or 16-bit) K and V as the decode kernel reads them,
    KIVI keys in a pool's pages as it reads them (:func:`.packed_rows.pages_decodable`: no
    window), rows aligned to 4 bytes, no pre-RoPE keys, no left padding."""
    return (
        batch.slot_table is not None
        and batch.rope_freq is None
        and batch.starts is None
        and keys_decodable(batch)
        and decodable(batch.v_spec, batch.head_dim)
        and batch.k_vec > 0
        and batch.v_vec > 0
    )


def launch_extend(
    batch: AttentionBatch,
    q: torch.Tensor,
    plan: ExtendPlan,
    new: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[N, Hq, D] in ``out_dtype`` of a batch :func:`serves_extend` (not ragged: [B, Tq, Hq,
    D]); ``q`` and ``new`` (the batch's k_new, v_new [N, Hkv, D], ragged only) as the kernel
    reads them (rotated, smoothed), the rest from ``batch``."""
    if not serves_extend(batch):
        raise ValueError("launch_extend: this batch is for the general kernel (see serves_extend)")
    indptr = batch.qo_indptr
    if indptr is None:  # Tq new tokens a request: the ragged layout with equal counts
        bsz, tq = q.shape[:2]
        ragged = _ragged(batch, q)
        out = launch_extend(ragged, q.reshape(bsz * tq, *q.shape[2:]), plan, out_dtype=out_dtype)
        return out.view(bsz, tq, *out.shape[1:])
    k_new, v_new = _hand_rows(q, batch, new)
    hq, dim, hkv = q.shape[-2], batch.head_dim, batch.kv_heads
    group = hq // hkv
    gp = next_power_of_2(group)
    bq = max(1, plan.rows // gp)  # new tokens a program
    block_tokens = page_tile(batch, plan.block_tokens)
    chunk, splits = split_chunk(batch, plan.splits, block_tokens)
    kivi = kivi_keys(batch)
    parts = splits + (1 if kivi else 0)  # KIVI: the filling page's program
    partial = torch.empty(q.shape[0], hq, parts, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(q.shape[0], hq, parts, dtype=torch.float32, device=q.device)
    k_args, v_args = rows_args(batch, "k"), rows_args(batch, "v")
    table, rows = batch.slot_table, table_rows(batch)
    stage = batch.k_stage if kivi else placeholder(q, 1)  # [rows, G, Hkv, D]
    stage_rows = batch.k_stage_rows if kivi else batch.lengths
    k, v = batch.k_spec, batch.v_spec
    grid = (batch.batch_size, hkv, cdiv(batch.q_tokens, bq) * parts)
    _extend_kernel[grid](
        q, k_args[0], k_args[1], v_args[0], v_args[1], table, rows, batch.lengths,
        batch.qo_indptr, partial, lse, k_new, v_new, stage, stage_rows, q.stride(0),
        q.stride(1), *k_args[3:], *v_args[3:], table.stride(0), *k_new.stride()[:2],
        *v_new.stride()[:2], *stage.stride()[:3], chunk, splits, **softmax_args(batch), D=dim,
        GROUP=group, GP=gp, BQ=bq, BT=block_tokens, K_BITS=k.bits, K_G=k.group_size,
        K_SYM=k.symmetric and k.is_quantized, K_VEC=batch.k_vec, V_BITS=v.bits, V_G=v.group_size,
        V_SYM=v.symmetric and v.is_quantized, V_VEC=batch.v_vec, HAND=new is not None,
        DOT_IEEE=q.dtype == torch.float32, K_CHANNEL=kivi, K_PLANES=batch.in_planes("k"),
        V_PLANES=batch.in_planes("v"), NARROW=narrow_offsets(batch), num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )  # fmt: skip
    return merge_splits(partial, lse, batch.sinks, out_dtype)


def _hand_rows(q: torch.Tensor, batch: AttentionBatch, new) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_new, v_new) [N, Hkv, D] for the kernel's pointers: the ones in hand as they are (the
    kernel turns them to its dots' dtype; fp32 under the interpreter, whose numpy has no bf16),
    or q itself twice (never read: HAND is off)."""
    if new is None:
        return q, q
    want = (q.shape[0], batch.kv_heads, batch.head_dim)
    if any(tuple(x.shape) != want or x.stride(-1) != 1 for x in new):
        raise ValueError(f"launch_extend: new tokens must be [N, Hkv, D] = {list(want)}")
    if q.dtype == torch.float32:
        return new[0].float(), new[1].float()
    return new[0], new[1]


def _ragged(batch: AttentionBatch, q: torch.Tensor) -> AttentionBatch:
    """A [B, Tq, Hq, D] batch as the ragged one it equals (``qo_indptr`` of Tq steps)."""
    bsz, tq = q.shape[:2]
    indptr = torch.arange(0, bsz * tq + 1, tq, dtype=torch.int32, device=q.device)
    flat = q.reshape(bsz * tq, *q.shape[2:])
    return dataclasses.replace(batch, q=flat, qo_indptr=indptr, max_q_len=tq)
