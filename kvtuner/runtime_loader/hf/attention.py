"""``attn_implementation="kvtuner"``: decode reads the packed history straight from the cache.

Registered in transformers' ``AttentionInterface`` (and its mask interface, as sdpa's masks) on
import. A :class:`~.layer.KVTunerLayer` whose :class:`KernelDispatch` accepts a decode step
stores the new token and returns it tagged with the layer instead of the dequantized history;
:func:`kvtuner_attention` then runs the fused kernel over the layer's packed rows and tail.
Everything else (prefill, CPU by default, other caches) is plain sdpa.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ...errors import KVTunerError

__all__ = ["ATTN_IMPLEMENTATION", "KernelDispatch", "kvtuner_attention", "use_kvtuner_attention"]

ATTN_IMPLEMENTATION = "kvtuner"
DECODE_KERNEL_MODES = ("auto", "always", "never")
_TAG = "_kvtuner_layer"  # attribute of a decode step's returned key: the layer to read
LAYER_KEY = "kvtuner_layer"  # a static layer's decode step: the attention keyword naming it


@dataclass(frozen=True)
class KernelDispatch:
    """When a decode step reads packed rows with the fused kernel.

    mode: ``"auto"`` on CUDA tensors only, ``"always"`` also on CPU (Triton's interpreter, set
    ``TRITON_INTERPRET=1`` first: tests), ``"never"``. Only ever for one new token per request,
    and only when the model runs ``attn_implementation="kvtuner"`` (any other attention needs
    the dequantized history).
    """

    mode: str = "auto"
    config: Any = None

    def __post_init__(self) -> None:
        if self.mode not in DECODE_KERNEL_MODES:
            raise ValueError(
                f"decode_kernel must be one of {DECODE_KERNEL_MODES}, got {self.mode!r}"
            )

    def wants(self, key_states: torch.Tensor) -> bool:
        if self.mode == "never" or key_states.shape[-2] != 1:
            return False
        if getattr(self.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
            return False
        return key_states.is_cuda or self.mode == "always"

    def fuses(self, key_states: torch.Tensor) -> bool:
        """A static layer's decode step (one new token a request, kvtuner's attention): the
        slots are read by one op, the kernel's or its reference (:meth:`kernel_on`)."""
        kvtuner = getattr(self.config, "_attn_implementation", None) == ATTN_IMPLEMENTATION
        return kvtuner and key_states.shape[-2] == 1

    def kernel_on(self, device: torch.device) -> bool:
        """Whether a static layer's decode reads its slots with the fused kernel on ``device``
        (else with the kernel's torch reference)."""
        return self.mode == "always" or (self.mode == "auto" and device.type == "cuda")


def tag(key_states: torch.Tensor, layer: Any) -> torch.Tensor:
    """A fresh alias of ``key_states`` marked with ``layer`` (never the tensor itself: the
    cache may keep that one as its tail, and a later read must not look fused)."""
    marker = key_states.view_as(key_states)
    setattr(marker, _TAG, layer)
    return marker


def is_fused(key_states: torch.Tensor) -> bool:
    """Whether a layer's ``update`` returned a tagged key (the fused kernel reads it)."""
    return getattr(key_states, _TAG, None) is not None


def left_padding_starts(mask: torch.Tensor | None, total: int) -> torch.Tensor | None | bool:
    """int32 [B] first attended position per request, from a decode step's mask (None: no
    mask); False when the mask is not a left-padding mask over ``total`` tokens. Computed once
    per mask (every layer of a step gets the same mask object)."""
    if mask is None:
        return None
    cached = getattr(mask, "_kvtuner_starts", None)
    if cached is not None and cached[0] == total:
        return cached[1]
    starts = False
    if mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[-1] == total:
        valid = mask[:, 0, -1, :]  # [B, T] the decode token's row
        first = (~valid).sum(-1)
        positions = torch.arange(total, device=mask.device)
        if torch.equal(valid, positions[None, :] >= first[:, None]):
            starts = first.to(torch.int32)
    mask._kvtuner_starts = (total, starts)
    return starts


def slot_starts(mask: torch.Tensor | None, length: torch.Tensor) -> torch.Tensor | None | bool:
    """int32 [B] first attended slot per request from a static layer's decode mask
    (``[B, 1, 1, max_cache_len]``, bool or additive; None: no mask). Eager, False when the
    mask attends anything but ``[first, length)``; compiled, taken on trust (no sync)."""
    if mask is None:
        return None
    valid = mask[:, 0, -1, :] if mask.dtype == torch.bool else mask[:, 0, -1, :] == 0
    first = valid.to(torch.int8).argmax(-1)
    if not torch.compiler.is_compiling():
        positions = torch.arange(valid.shape[-1], device=valid.device)
        span = (positions[None, :] >= first[:, None]) & (positions[None, :] < length)
        if not torch.equal(valid, span):
            return False
    return first.to(torch.int32)


def kvtuner_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query [B, Hq, T, D] -> ([B, T, Hq, D], None)."""
    static = kwargs.pop(LAYER_KEY, None)
    if static is not None:
        starts = slot_starts(attention_mask, static.cumulative_length)
        if starts is not False:
            return static.attend(query[:, :, 0], starts=starts, sm_scale=scaling).unsqueeze(1), None
        key, value = static.history(query.dtype)  # an unusual mask: the dequantized path
    elif key.dtype == torch.uint8:
        raise KVTunerError(
            "a static kvtuner cache returned its packed slots, but this model's attention did "
            "not receive the cache's keywords; use make_cache(..., max_cache_len=None)"
        )
    layer = getattr(key, _TAG, None)
    if layer is not None:
        starts = left_padding_starts(attention_mask, layer.k.num_tokens)  # stored tokens
        if starts is not False:
            out = layer.attend(query[:, :, 0], starts=starts, sm_scale=scaling)
            return out.unsqueeze(1), None
        key, value = layer.history(query.dtype)  # an unusual mask: the dequantized path
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def register_attention() -> None:
    """Make ``attn_implementation="kvtuner"`` known to transformers (idempotent)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvtuner_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def use_kvtuner_attention(model: Any) -> Any:
    """Switch ``model`` to ``attn_implementation="kvtuner"`` (returns it): with a cache from
    :func:`~.cache.make_cache`, decode then reads packed rows on CUDA."""
    register_attention()
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


register_attention()
