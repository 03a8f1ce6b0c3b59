"""VllmFormatLayer: a transformers cache layer that stores one decoder layer's K and V the way
vLLM stores a layer of its ``--kv-cache-dtype`` (see :mod:`kvtuner.quant.vllm_format`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ...quant.vllm_format import VllmKVFormat


class _Stored:
    """One side's history in one format: codes [B, H, T, D] in vLLM's storage dtype ([B, H, T,
    D/2] uint8 for the 4-bit formats) and their scales ([B, H, T] fp32 per token-head, [B, H, T,
    D/16] fp8 NVFP4 block scales) or None (per-tensor scale); the model dtype: the states."""

    def __init__(self, fmt: VllmKVFormat | None, which: str) -> None:
        self.fmt, self.which = fmt, which
        self.codes: torch.Tensor | None = None
        self.scales: torch.Tensor | None = None

    def append(self, x: torch.Tensor) -> None:
        codes, scales = (x, None) if self.fmt is None else self.fmt.store(x, self.which)
        cat = lambda old, new: new if old is None else torch.cat([old, new], dim=2)  # noqa: E731
        self.codes = cat(self.codes, codes)
        if scales is not None:
            self.scales = cat(self.scales, scales)

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        if self.fmt is None:
            return self.codes
        return self.fmt.load(self.codes, self.scales, self.which, dtype)

    def nbytes(self) -> int:
        sizes = [t.numel() * t.element_size() for t in (self.codes, self.scales) if t is not None]
        return sum(sizes)


class VllmFormatLayer(DynamicLayer):
    """``update(k, v)`` stores the new states [B, H, T, D] as vLLM would (codes and scales) and
    returns the whole history read back as vLLM's attention reads it, in the states' dtype
    (int4: the K and V attention effectively sees, un-rotated to the model's basis). K and V
    may differ in format (``fp8k_nvfp4v``); None keeps a side at the model's dtype."""

    is_croppable = False

    def __init__(self, key_format: VllmKVFormat | None, value_format: VllmKVFormat | None):
        super().__init__()
        self.formats = key_format, value_format
        self.k, self.v = _Stored(key_format, "k"), _Stored(value_format, "v")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.k.append(key_states)
        self.v.append(value_states)
        return self.k.read(key_states.dtype), self.v.read(value_states.dtype)

    def get_seq_length(self) -> int:
        return 0 if self.k.codes is None else self.k.codes.shape[-2]

    def nbytes(self) -> int:
        """Bytes this layer stores: codes plus fp32 scales, as in vLLM's page."""
        return self.k.nbytes() + self.v.nbytes()

    def reset(self) -> None:
        self.k, self.v = _Stored(self.formats[0], "k"), _Stored(self.formats[1], "v")
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("the vLLM-format cache cannot crop tokens")
