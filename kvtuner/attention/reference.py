"""Torch references of :mod:`.decode`'s kernels: gather, dequantize, then SDPA (fp32); with a
logit soft cap or attention sinks the softmax is written out."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..quant.planes import from_planes
from ..quant.reference import dequantize
from ..quant.smoothing import unsmooth
from ..quant.spec import QuantSpec
from .extend_kernel import serves_extend
from .layout import AttentionBatch
from .rope import rope_forward

__all__ = ["decode_attention_reference", "extend_attention_reference", "request_kv"]


def request_kv(batch: AttentionBatch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's stored K and V, dequantized fp32 [Hkv, T_b, D] (packed, then tail); smoothed
    key rows (``k / λ``) multiplied back by λ; pre-RoPE keys rotated forward to positions
    ``rope_offset (+ [b]) + t``."""
    dim, v_len = batch.head_dim, int(batch.lengths[b])
    out = []
    for name, rows, spec, tail, n, lam in (
        ("k", batch.k_rows, batch.k_spec, batch.k_tail, v_len + batch.k_delta, batch.k_smooth),
        ("v", batch.v_rows, batch.v_spec, batch.v_tail, v_len, None),
    ):
        if batch.slot_table is not None:
            row = b if batch.table_rows is None else int(batch.table_rows[b])
            slots = batch.slot_table[row, :n].long()
            if rows is batch.k_rows and batch.k_stage is not None:
                out.append(_paged_channel_keys(batch, slots))
                continue
            mine = rows[slots]
            if batch.in_planes(name):
                mine = from_planes(mine, spec, dim)
            mine = mine.transpose(0, 1)  # [Hkv, n, R]
        elif spec.axis == "channel" and spec.is_quantized:
            mine = rows[b, :, : n // spec.group_size]  # blocks of G tokens
        else:
            mine = rows[b, :, :n]
        x = unsmooth(dequantize(mine, spec, dim, torch.float32), lam, -3, torch.float32)
        if tail is not None:
            x = torch.cat([x, tail[b].float()], dim=1)
        out.append(x)
    if batch.rope_freq is not None:
        off = batch.rope_offset
        start = int(off[b]) if isinstance(off, torch.Tensor) else off
        out[0] = rope_forward(out[0], batch.rope_freq, start)
    return out[0], out[1]


def _paged_channel_keys(batch: AttentionBatch, slots: torch.Tensor) -> torch.Tensor:
    """fp32 [Hkv, n, D] keys of pool ``slots``: staged fp values of filling pages, else the
    dequantized block of the slot's page (page = slot // G)."""
    spec = batch.k_spec
    pages, pos = slots // spec.group_size, slots % spec.group_size
    blocks = batch.k_rows[pages].unsqueeze(2)  # [n, Hkv, 1 block, bytes]
    keys = dequantize(blocks, spec, batch.head_dim, torch.float32)  # [n, Hkv, G, D]
    keys = keys[torch.arange(len(slots)), :, pos]  # [n, Hkv, D]
    rows = batch.k_stage_rows[pages].long()
    staged = rows >= 0
    keys[staged] = batch.k_stage[rows[staged], pos[staged]].float()
    return keys.transpose(0, 1)


def _queries(batch: AttentionBatch, b: int) -> torch.Tensor:
    """Request b's queries [Tq_b, Hq, D] (its newest tokens)."""
    if batch.qo_indptr is None:
        return batch.q[b]
    return batch.q[int(batch.qo_indptr[b]) : int(batch.qo_indptr[b + 1])]


def _with_new(batch: AttentionBatch, b: int, k: torch.Tensor, v: torch.Tensor):
    """K, V fp32 [Hkv, T_b, D] with request b's newest positions read from k_new / v_new."""
    first, last = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
    k, v = k.clone(), v.clone()
    if last > first:
        k[:, k.shape[1] - (last - first) :] = batch.k_new[first:last].transpose(0, 1).float()
        v[:, v.shape[1] - (last - first) :] = batch.v_new[first:last].transpose(0, 1).float()
    return k, v


def _allowed(batch: AttentionBatch, b: int, q_len: int, total: int) -> torch.Tensor:
    """bool [Tq, total]: query i (position p = total - Tq + i) sees keys in [start, p], and
    with a window only those in (p - window, p]."""
    dev = batch.q.device
    pos = torch.arange(total, device=dev)
    q_pos = total - q_len + torch.arange(q_len, device=dev)
    start = 0 if batch.starts is None else int(batch.starts[b])
    allowed = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] >= start)
    if batch.window is not None:
        allowed &= pos[None, :] > q_pos[:, None] - batch.window
    return allowed


def _softmax_attention(batch: AttentionBatch, q, k, v, allowed) -> torch.Tensor:
    """fp32 q [Hq, Tq, D] over k/v [Hkv, T, D] -> [Hq, Tq, D], written out: scores, soft cap,
    mask, softmax with each head's sink as one more logit (then dropped)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scale = batch.sm_scale if batch.sm_scale is not None else q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2) * scale  # [Hq, Tq, T]
    if batch.logit_cap is not None:
        s = batch.logit_cap * torch.tanh(s / batch.logit_cap)
    s = s.masked_fill(~allowed, -float("inf"))
    if batch.sinks is not None:
        sink = batch.sinks.float()[:, None, None].expand(-1, s.shape[1], 1)
        s = torch.cat([s, sink], dim=-1)
    return torch.softmax(s, dim=-1)[..., : k.shape[1]] @ v


def _attention(batch: AttentionBatch, q, k, v, allowed) -> torch.Tensor:
    """q [Tq, Hq, D] -> [Tq, Hq, D]: SDPA, or written out with a soft cap or sinks."""
    if batch.logit_cap is None and batch.sinks is None:
        att = F.scaled_dot_product_attention(
            q.transpose(0, 1), k, v, attn_mask=allowed, scale=batch.sm_scale, enable_gqa=True
        )
    else:
        att = _softmax_attention(batch, q.transpose(0, 1), k, v, allowed)
    return att.transpose(0, 1)


def extend_attention_reference(
    q: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    k_spec: QuantSpec,
    v_spec: QuantSpec,
    **kwargs: Any,
) -> torch.Tensor:
    """Same arguments as :func:`~.decode.extend_attention` (its launch options ignored)
    -> [B, Tq, Hq, D] (ragged: [N, Hq, D]) in q's dtype; a query with nothing to attend gets
    zeros. New tokens in hand (``k_new``, ``v_new``) replace their stored rows where the extend
    kernel runs the batch, as there."""
    for launch_option in ("num_splits", "block_tokens", "num_warps", "num_stages", "query_rows"):
        kwargs.pop(launch_option, None)
    batch = AttentionBatch(
        q=q, k_rows=k_rows, v_rows=v_rows, k_spec=k_spec, v_spec=v_spec, **kwargs
    )
    hand = batch.k_new is not None and serves_extend(batch)
    outs = []
    for b in range(batch.batch_size):
        qb = _queries(batch, b).float()  # [Tq_b, Hq, D]
        k, v = request_kv(batch, b)
        if hand:
            k, v = _with_new(batch, b, k, v)
        allowed = _allowed(batch, b, qb.shape[0], k.shape[1])
        seen = allowed.any(-1)  # [Tq_b]
        out = torch.zeros_like(qb)
        if seen.any():
            out = torch.where(seen[:, None, None], _attention(batch, qb, k, v, allowed), 0.0)
        outs.append(out)
    stacked = torch.cat(outs) if batch.qo_indptr is not None else torch.stack(outs)
    return stacked.to(q.dtype)


def decode_attention_reference(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """:func:`extend_attention_reference` of one query token per request, q [B, Hq, D]."""
    return extend_attention_reference(q.unsqueeze(1), *args, **kwargs).squeeze(1)
