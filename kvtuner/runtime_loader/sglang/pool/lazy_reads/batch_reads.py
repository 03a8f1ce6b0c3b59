"""BatchReads: the lazy read mode's per-layer batch cache.

SGLang's ``torch_native`` backend reads K and V once per request: ``k_cache[req_to_token[r, :len]]``
then ``v_cache[...]``, request after request in the batch's order. The plugin announces the
batch's slots in that same order (``batch_read_slots``: request 0's slots, then request 1's, ...),
so the first read of a layer dequantizes the whole batch once (K and V together) and every
request's read is a contiguous range of it. The dense K/V of one layer's batch is transient
working memory (batch tokens x heads x head_dim, like activations), dropped at the next write or
layer; it never scales with the pool's slots. A read whose slot ids do not match the next range is
not served here (the pool then reads those slots directly), so a mismatch costs speed, not
correctness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BatchReads", "batch_read_slots"]

ReadKV = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class BatchReads:
    """Announced batch slots (int64 [n]) and the dense K/V of the layer read last."""

    def __init__(self) -> None:
        self.slots: torch.Tensor | None = None
        self.invalidate()

    def announce(self, slots: torch.Tensor | None) -> None:
        """The slots the next forward reads, request by request (None: nothing announced)."""
        self.slots = slots
        self.invalidate()

    def invalidate(self) -> None:
        """Drop the dense batch (a write may have changed the rows)."""
        self._layer: int | None = None
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._last = (0, 0)  # (start, length) of the range served last

    def serve(self, layer_id: int, which: str, loc: torch.Tensor, read_kv: ReadKV):
        """K (``which="k"``) or V [len(loc), heads, D] of slots ``loc`` from the dense batch, or
        None when ``loc`` is not the range served last or the one after it."""
        if self.slots is None or self.slots.numel() == 0:
            return None
        if self._layer != layer_id:
            self._kv, self._layer, self._last = read_kv(layer_id, self.slots), layer_id, (0, 0)
        ids = loc if loc.dtype == self.slots.dtype else loc.to(self.slots.dtype)
        n = ids.numel()
        start, length = self._last
        for s in (start, start + length):  # V after K of one request; the next request
            if s + n <= self.slots.numel() and torch.equal(self.slots[s : s + n], ids):
                self._last = (s, n)
                return self._kv[0 if which == "k" else 1][s : s + n]
        return None


def batch_read_slots(forward_batch: Any, req_to_token: torch.Tensor) -> torch.Tensor:
    """Slot ids a forward batch's attention reads: ``req_to_token[r, :seq_len]`` of every
    request (int64 [sum(seq_lens)]). The lengths are the device ``seq_lens`` the attention
    backends index with (``seq_lens_cpu`` can lag behind them under overlap scheduling)."""
    seq_lens, rows = forward_batch.seq_lens, forward_batch.req_pool_indices
    if rows is None or seq_lens is None or seq_lens.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=req_to_token.device)
    max_len = int(seq_lens.max())
    table = req_to_token[rows, :max_len]  # [bs, max_len]
    keep = torch.arange(max_len, device=table.device)[None, :] < seq_lens[:, None]
    return table[keep].long()
