"""Torch reference of :func:`~.decode.decode_attention`: gather, dequantize, then SDPA (fp32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant.reference import dequantize
from .layout import DecodeBatch

__all__ = ["decode_attention_reference", "request_kv"]


def request_kv(batch: DecodeBatch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's attended K and V, dequantized fp32 [Hkv, T_b, D] (packed, then tail, from
    ``starts[b]`` on)."""
    n, dim = int(batch.lengths[b]), batch.q.shape[2]
    out = []
    for rows, spec, tail in (
        (batch.k_rows, batch.k_spec, batch.k_tail),
        (batch.v_rows, batch.v_spec, batch.v_tail),
    ):
        if batch.slot_table is not None:
            row = b if batch.table_rows is None else int(batch.table_rows[b])
            mine = rows[batch.slot_table[row, :n].long()].transpose(0, 1)  # [Hkv, n, R]
        else:
            mine = rows[b, :, :n]
        x = dequantize(mine, spec, dim, torch.float32)
        if tail is not None:
            x = torch.cat([x, tail[b].float()], dim=1)
        start = 0 if batch.starts is None else int(batch.starts[b])
        out.append(x[:, start:])
    return out[0], out[1]


def decode_attention_reference(q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Same arguments as :func:`~.decode.decode_attention` (``num_splits``/``block_tokens``
    ignored) -> [B, Hq, D] in q's dtype; a request with nothing to attend gets zeros."""
    kwargs.pop("num_splits", None)
    kwargs.pop("block_tokens", None)
    batch = DecodeBatch(q, *args, **kwargs)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        k, v = request_kv(batch, b)
        if k.shape[1]:
            qb = q[b].float().unsqueeze(1)  # [Hq, 1, D]
            att = F.scaled_dot_product_attention(qb, k, v, scale=batch.sm_scale, enable_gqa=True)
            out[b] = att.squeeze(1)
    return out.to(q.dtype)
