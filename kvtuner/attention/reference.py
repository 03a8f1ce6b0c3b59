"""Torch references of :mod:`.decode`'s kernels: gather, dequantize, then SDPA (fp32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant.reference import dequantize
from ..quant.smoothing import unsmooth
from .layout import AttentionBatch

__all__ = ["decode_attention_reference", "extend_attention_reference", "request_kv"]


def request_kv(batch: AttentionBatch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's stored K and V, dequantized fp32 [Hkv, T_b, D] (packed, then tail); smoothed
    key rows (``k / λ``) multiplied back by λ."""
    dim, v_len = batch.head_dim, int(batch.lengths[b])
    out = []
    for rows, spec, tail, n, lam in (
        (batch.k_rows, batch.k_spec, batch.k_tail, v_len + batch.k_delta, batch.k_smooth),
        (batch.v_rows, batch.v_spec, batch.v_tail, v_len, None),
    ):
        if batch.slot_table is not None:
            row = b if batch.table_rows is None else int(batch.table_rows[b])
            mine = rows[batch.slot_table[row, :n].long()].transpose(0, 1)  # [Hkv, n, R]
        elif spec.axis == "channel" and spec.is_quantized:
            mine = rows[b, :, : n // spec.group_size]  # blocks of G tokens
        else:
            mine = rows[b, :, :n]
        x = unsmooth(dequantize(mine, spec, dim, torch.float32), lam, -3, torch.float32)
        if tail is not None:
            x = torch.cat([x, tail[b].float()], dim=1)
        out.append(x)
    return out[0], out[1]


def _queries(batch: AttentionBatch, b: int) -> torch.Tensor:
    """Request b's queries [Tq_b, Hq, D] (its newest tokens)."""
    if batch.qo_indptr is None:
        return batch.q[b]
    return batch.q[int(batch.qo_indptr[b]) : int(batch.qo_indptr[b + 1])]


def _allowed(batch: AttentionBatch, b: int, q_len: int, total: int) -> torch.Tensor:
    """bool [Tq, total]: query i (position total - Tq + i) sees keys in [start, its position]."""
    dev = batch.q.device
    pos = torch.arange(total, device=dev)
    q_pos = total - q_len + torch.arange(q_len, device=dev)
    start = 0 if batch.starts is None else int(batch.starts[b])
    return (pos[None, :] <= q_pos[:, None]) & (pos[None, :] >= start)


def extend_attention_reference(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Same arguments as :func:`~.decode.extend_attention` (``num_splits``/``block_tokens``
    ignored) -> [B, Tq, Hq, D] (ragged: [N, Hq, D]) in q's dtype; a query with nothing to
    attend gets zeros."""
    kwargs.pop("num_splits", None)
    kwargs.pop("block_tokens", None)
    batch = AttentionBatch(q, *args, **kwargs)
    outs = []
    for b in range(batch.batch_size):
        qb = _queries(batch, b).float()  # [Tq_b, Hq, D]
        k, v = request_kv(batch, b)
        allowed = _allowed(batch, b, qb.shape[0], k.shape[1])
        seen = allowed.any(-1)  # [Tq_b]
        out = torch.zeros_like(qb)
        if seen.any():
            att = F.scaled_dot_product_attention(
                qb.transpose(0, 1), k, v, attn_mask=allowed, scale=batch.sm_scale, enable_gqa=True
            )
            out = torch.where(seen[:, None, None], att.transpose(0, 1), 0.0)
        outs.append(out)
    stacked = torch.cat(outs) if batch.qo_indptr is not None else torch.stack(outs)
    return stacked.to(q.dtype)


def decode_attention_reference(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """:func:`extend_attention_reference` of one query token per request, q [B, Hq, D]."""
    return extend_attention_reference(q.unsqueeze(1), *args, **kwargs).squeeze(1)
