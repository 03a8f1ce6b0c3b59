"""VllmFormatLayer: a transformers cache layer that stores one decoder layer's K and V the way
vLLM stores a layer of its ``--kv-cache-dtype`` (see :mod:`kvtuner.quant.vllm_format`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from ...quant.vllm_format import VllmKVFormat


class _Stored:
    """One side's history in one format: the tensors :meth:`VllmKVFormat.store` gives, each
    [B, H, T, ...] (codes [B, H, T, D] in vLLM's storage dtype, [B, H, T, D/2] for the 4-bit
    formats; scales [B, H, T] fp32 per token-head, [B, H, T, D/16] NVFP4 block scales; None for
    a per-tensor scale), concatenated along T; the model dtype: the states themselves."""

    def __init__(self, fmt: VllmKVFormat | None, which: str) -> None:
        self.fmt, self.which = fmt, which
        self.parts: tuple[torch.Tensor | None, ...] = ()

    def append(self, x: torch.Tensor) -> None:
        new = (x,) if self.fmt is None else self.fmt.store(x, self.which)
        cat = lambda old, t: t if old is None else torch.cat([old, t], dim=2)  # noqa: E731
        old = self.parts or (None,) * len(new)
        self.parts = tuple(cat(a, b) for a, b in zip(old, new, strict=True))

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        return self.parts[0] if self.fmt is None else self.fmt.load(self.parts, self.which, dtype)

    @property
    def tokens(self) -> int:
        return 0 if not self.parts else self.parts[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts if t is not None)


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
        return self.k.tokens

    def nbytes(self) -> int:
        """Bytes this layer stores: codes plus fp32 scales, as in vLLM's page."""
        return self.k.nbytes() + self.v.nbytes()

    def reset(self) -> None:
        self.k, self.v = _Stored(self.formats[0], "k"), _Stored(self.formats[1], "v")
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("the vLLM-format cache cannot crop tokens")
