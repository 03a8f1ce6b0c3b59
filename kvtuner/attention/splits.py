"""Split-K bookkeeping shared by the attention kernels (:mod:`.kernel`, :mod:`.decode_kernel`,
:mod:`.extend_kernel`): how the packed tokens are cut into splits, the softmax arguments in log2
units, each split's partial stored, and the reduce that merges each (query row, head)'s split
partials (with attention sinks)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.intmath import cdiv, next_power_of_2
from .layout import AttentionBatch

__all__ = ["LOG2E", "merge_splits", "softmax_args", "split_chunk", "store_partial"]

LOG2E = 1.4426950408889634


@triton.jit
def store_partial(o_ptr, lse_ptr, at, m, denom, acc, ok):
    """One split's online softmax (max m, denominator [R], acc [R, D]) -> its normalized partial
    and log2-sum-exp at partial index ``at`` [R] (rows ``ok``); nothing seen: lse -inf."""
    D: tl.constexpr = acc.shape[1]
    seen = denom > 0
    out = acc / tl.where(seen, denom, 1.0)[:, None]
    lse = tl.where(seen, m + tl.log2(tl.where(seen, denom, 1.0)), -float("inf"))
    tl.store(lse_ptr + at, lse, mask=ok)
    tl.store(o_ptr + at[:, None] * D + tl.arange(0, D)[None, :], out, mask=ok[:, None])


@triton.jit
def _reduce_kernel(o_ptr, lse_ptr, sinks_ptr, out_ptr, num_splits, hq, D: tl.constexpr,
                   S_PAD: tl.constexpr, HAS_SINKS: tl.constexpr):  # fmt: skip
    """Merge the splits of one (request, query, head): softmax-weighted by their log2-sum-exp;
    with sinks, ``exp(sink of the head)`` joins the softmax denominator."""
    bh = tl.program_id(0).to(tl.int64)
    s, d = tl.arange(0, S_PAD), tl.arange(0, D)
    ok = s < num_splits
    lse = tl.load(lse_ptr + bh * num_splits + s, mask=ok, other=-float("inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == -float("inf"), 0.0, top)
    w = tl.exp2(lse - top)  # empty splits weigh 0
    o = tl.load(
        o_ptr + (bh * num_splits + s)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    if HAS_SINKS:  # out · Σexp / (Σexp + exp(sink)), in log2 units; nothing seen: stays 0
        sink = tl.load(sinks_ptr + bh % hq)  # log2 units (the launcher scales by log2 e)
        out = out / (1.0 + tl.exp2(sink - top - tl.log2(tl.where(total > 0, total, 1.0))))
    tl.store(out_ptr + bh * D + d, out.to(out_ptr.dtype.element_ty))


def merge_splits(
    partial: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Partials fp32 [rows, Hq, S, D] and their log2-sum-exp [rows, Hq, S] -> [rows, Hq, D] in
    ``dtype`` (merged in fp32, rounded once on the store: a model dtype here saves an eager
    step the cast's launch); ``sinks`` [Hq] (natural-log logits) join each head's denominator."""
    rows, hq, splits, dim = partial.shape
    out = torch.empty(rows, hq, dim, dtype=dtype, device=partial.device)
    sink_log2 = sinks.float() * LOG2E if sinks is not None else lse  # unused pointer if None
    _reduce_kernel[(rows * hq,)](partial, lse, sink_log2, out, splits, hq, D=dim,
                                 S_PAD=next_power_of_2(splits),
                                 HAS_SINKS=sinks is not None)  # fmt: skip
    return out


def softmax_args(batch: AttentionBatch) -> dict:
    """Scores' scale (log2 units), soft cap and window as the kernels take them."""
    sm_scale = batch.sm_scale if batch.sm_scale is not None else batch.head_dim**-0.5
    cap = batch.logit_cap
    scale = sm_scale / cap if cap else sm_scale * LOG2E
    return dict(window=batch.window or 0, score_scale=scale, cap_log2=(cap or 0.0) * LOG2E,
                WINDOW=batch.window is not None, SOFTCAP=cap is not None)  # fmt: skip


def split_chunk(batch: AttentionBatch, splits: int, block_tokens: int) -> tuple[int, int]:
    """(tokens per split, splits): the packed width, or with a window only the span of keys
    one block of queries can see, cut in ``splits`` multiples of ``block_tokens``."""
    span = max(batch.span, 1)
    chunk = cdiv(cdiv(span, splits), block_tokens) * block_tokens
    return chunk, max(1, cdiv(span, chunk))
