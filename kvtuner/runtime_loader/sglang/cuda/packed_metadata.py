"""PackedMetadata: how one SGLang forward indexes the packed pool for the fused kernels.

Free of sglang imports, so a benchmark on a machine without SGLang runs the backend's exact
launches over the same tensors (``req_to_token [rows, W]`` int32, packed rows
``[slots, Hkv, R]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ....attention import choose_splits

__all__ = ["PackedMetadata"]


def _int32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.int32 else x.to(torch.int32)


@dataclass(frozen=True)
class PackedMetadata:
    """One forward's indexing: int32 ``lengths [B]`` (stored tokens, new ones included) and
    ``table_rows [B]`` (rows of ``slot_table``, SGLang's ``req_to_token[:, :width]``); extend:
    ``qo_indptr [B+1]`` int32 and ``max_q_len`` (host bound of new tokens per request).
    ``num_splits`` None: each layer's decode plan chooses them (at its tile's warps) from the
    same shapes, so every forward of a batch size launches alike (CUDA graphs)."""

    lengths: torch.Tensor
    table_rows: torch.Tensor
    slot_table: torch.Tensor
    num_splits: int | None
    qo_indptr: torch.Tensor | None = None
    max_q_len: int = 1

    def __post_init__(self) -> None:
        for name in ("lengths", "table_rows"):
            t = getattr(self, name)
            if t.dtype != torch.int32 or t.dim() != 1:
                raise ValueError(f"{name} must be int32 [B], got {t.dtype} {tuple(t.shape)}")
        if (self.num_splits is not None and self.num_splits < 1) or self.max_q_len < 1:
            raise ValueError(f"num_splits and max_q_len must be >= 1: {self!r}")

    @classmethod
    def decode(cls, seq_lens, req_pool_indices, slot_table) -> PackedMetadata:
        """One new token per request; splits from each layer's plan."""
        return cls(_int32(seq_lens), _int32(req_pool_indices), slot_table, None)

    @classmethod
    def extend(
        cls, seq_lens, req_pool_indices, slot_table, kv_heads: int, new_tokens, max_q_len: int
    ) -> PackedMetadata:
        """``new_tokens [B]`` (SGLang's ``extend_seq_lens``, device) become ``qo_indptr``."""
        indptr = torch.zeros(len(new_tokens) + 1, dtype=torch.int32, device=new_tokens.device)
        indptr[1:] = torch.cumsum(new_tokens, 0)
        max_q = max(1, int(max_q_len))
        rows = len(seq_lens) * max_q
        splits = choose_splits(rows, kv_heads, slot_table.shape[1], slot_table.device)
        lengths, table_rows = _int32(seq_lens), _int32(req_pool_indices)
        return cls(lengths, table_rows, slot_table, splits, qo_indptr=indptr, max_q_len=max_q)

    def kernel_args(self) -> dict[str, Any]:
        """Keywords of :func:`kvtuner.attention.decode_attention` / ``extend_attention``."""
        args = dict(lengths=self.lengths, slot_table=self.slot_table, table_rows=self.table_rows)
        if self.qo_indptr is not None:
            args.update(qo_indptr=self.qo_indptr, max_q_len=self.max_q_len)
        return args if self.num_splits is None else dict(args, num_splits=self.num_splits)
