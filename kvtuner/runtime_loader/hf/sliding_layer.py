"""KVTunerSlidingLayer: a packed cache layer for a sliding-window attention layer.

Same semantics as transformers' ``DynamicSlidingWindowLayer`` (5.x), so a 16-bit profile gives
the default cache's logits exactly: ``update`` returns the stored tokens plus the new ones, then
keeps only the newest ``window - 1`` (the next query completes its window); ``get_seq_length`` is
every token seen, ``get_mask_sizes`` the visible span and its offset. Dropped tokens leave the
packed rows too: the layer never stores more than ``window - 1`` tokens between steps.

A decode step sent to the fused kernel (:mod:`.attention`) keeps the oldest token until the
kernel has read it (the query's window is the ``window - 1`` stored tokens plus itself, and the
step's mask covers exactly those): the drop then follows :meth:`attend`, or at the latest the next
:meth:`update`, before it stores anything.
"""

from __future__ import annotations

import torch

from ...profile import LayerSpec
from .attention import is_fused
from .layer import KVTunerLayer


class KVTunerSlidingLayer(KVTunerLayer):
    is_sliding = True

    def __init__(self, spec: LayerSpec, head_dim: int, *, sliding_window: int, **kwargs):
        super().__init__(spec, head_dim, **kwargs)
        self.sliding_window = sliding_window
        self.cumulative_length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._drop_excess()  # a fused step's pending drop, before the new keys' positions
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.cumulative_length += key_states.shape[-2]
        if not is_fused(keys):  # fused: the kernel reads the window first (see attend)
            self._drop_excess()
        return keys, values

    def attend(self, q: torch.Tensor, **kwargs) -> torch.Tensor:
        """The fused step: the stored window (``window - 1`` tokens and the new one), then the
        drop that :meth:`update` left pending."""
        out = super().attend(q, **kwargs)
        self._drop_excess()
        return out

    def _drop_excess(self) -> None:
        """Keep only the newest ``window - 1`` tokens; the first stored position moves on."""
        excess = self.k.num_tokens - (self.sliding_window - 1)
        if excess > 0:
            self.k.drop_oldest(excess)
            self.v.drop_oldest(excess)
            self.first_position += excess
            self.keys, self.values = self.k.tail, self.v.tail

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        seen, window = self.cumulative_length, self.sliding_window
        kv_offset = max(seen - window + 1, 0)
        kv_length = (window - 1 if seen >= window else seen) + query_length
        return kv_length, kv_offset

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.sliding_window

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0
