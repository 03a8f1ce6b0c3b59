"""VllmFormatLayer: a transformers cache layer that stores one decoder layer's K and V the way
vLLM stores a layer of its ``--kv-cache-dtype`` (see :mod:`kvtuner.quant.vllm_format`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ...quant.vllm_format import VllmKVFormat


class _Stored:
    """One side's history: codes [B, H, T, D] in vLLM's storage dtype ([B, H, T, D/2] uint8 for
    int4), fp32 scales [B, H, T] (per-token-head formats) or None (per-tensor scale)."""

    def __init__(self) -> None:
        self.codes: torch.Tensor | None = None
        self.scales: torch.Tensor | None = None

    def append(self, codes: torch.Tensor, scales: torch.Tensor | None) -> None:
        cat = lambda old, new: new if old is None else torch.cat([old, new], dim=-2)  # noqa: E731
        self.codes = cat(self.codes, codes)
        if scales is not None:
            self.scales = scales if self.scales is None else torch.cat([self.scales, scales], -1)

    def nbytes(self) -> int:
        sizes = [t.numel() * t.element_size() for t in (self.codes, self.scales) if t is not None]
        return sum(sizes)


class VllmFormatLayer(DynamicLayer):
    """``update(k, v)`` stores the new states [B, H, T, D] as vLLM would (codes and scales) and
    returns the whole history read back as vLLM's attention reads it, in the states' dtype
    (int4: the K and V attention effectively sees, un-rotated to the model's basis)."""

    is_croppable = False

    def __init__(self, fmt: VllmKVFormat):
        super().__init__()
        self.fmt = fmt
        self.k, self.v = _Stored(), _Stored()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k.append(*self.fmt.store(key_states, "k"))
        self.v.append(*self.fmt.store(value_states, "v"))
        dtype = key_states.dtype
        keys = self.fmt.load(self.k.codes, self.k.scales, "k", dtype)
        values = self.fmt.load(self.v.codes, self.v.scales, "v", dtype)
        return keys, values

    def get_seq_length(self) -> int:
        return 0 if self.k.codes is None else self.k.codes.shape[-2]

    def nbytes(self) -> int:
        """Bytes this layer stores: codes plus fp32 scales, as in vLLM's page."""
        return self.k.nbytes() + self.v.nbytes()

    def reset(self) -> None:
        self.k, self.v = _Stored(), _Stored()
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("the vLLM-format cache cannot crop tokens")
