"""``attn_implementation="kvtuner"``: decode reads the packed history straight from the cache.

Registered in transformers' ``AttentionInterface`` (and its mask interface, as sdpa's masks) on
import. A cache layer whose :class:`KernelDispatch` accepts a decode step stores the new token
and returns a key tagged with the layer (:func:`tag`) instead of the dequantized history;
:func:`kvtuner_attention` then calls the layer's ``attend`` (the fused kernel over its packed
rows). The tag is an attribute of the key tensor: it reaches attention through any model's
code and any transformers release, eagerly and in a compiled graph. Everything else (prefill,
CPU by default, other caches) is plain sdpa.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["ATTN_IMPLEMENTATION", "KernelDispatch", "kvtuner_attention", "use_kvtuner_attention"]

ATTN_IMPLEMENTATION = "kvtuner"
DECODE_KERNEL_MODES = ("auto", "always", "never")
_TAG = "_kvtuner_layer"  # attribute of a fused decode step's returned key: the layer to read


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


def tag(key: torch.Tensor, layer: Any) -> torch.Tensor:
    """A fresh alias of ``key`` marked with ``layer`` (never the tensor itself: a dynamic layer
    may keep that one as its tail, and a later read must not look fused; a static layer tags
    an alias of its key slots once, when it allocates them)."""
    marker = key.view_as(key)
    setattr(marker, _TAG, layer)
    return marker


def is_fused(key: torch.Tensor) -> bool:
    """Whether a layer's ``update`` returned a tagged key (attention reads the layer)."""
    return getattr(key, _TAG, None) is not None


def mask_starts(
    mask: torch.Tensor | None, stored: int | torch.Tensor
) -> torch.Tensor | None | bool:
    """int32 [B] first attended position per request from a decode step's mask
    ``[B, 1, 1, W]`` (bool, or additive: 0 attends; None: no mask), the layer holding
    ``stored`` tokens (an int: W must be it; a static layer's length tensor: W is its slots).
    False when the mask attends anything but ``[first, stored)`` (checked eagerly: a sync;
    a compiled step takes it as left padding). Eager, computed once a mask and length (every
    layer of a step gets the same mask object)."""
    if mask is None:
        return None
    eager = not torch.compiler.is_compiling()
    key = stored if eager and isinstance(stored, int) else None
    cached = getattr(mask, "_kvtuner_starts", None) if key is not None else None
    if cached is not None and cached[0] == key:
        return cached[1]
    starts = _first_attended(mask, stored, check=eager)
    if key is not None:
        mask._kvtuner_starts = (key, starts)
    return starts


def _first_attended(mask: torch.Tensor, stored: int | torch.Tensor, *, check: bool):
    if mask.dim() != 4 or (isinstance(stored, int) and mask.shape[-1] != stored):
        return False
    row = mask[:, 0, -1, :]  # [B, W] the decode token's row
    valid = row if row.dtype == torch.bool else row == 0
    first = valid.to(torch.int8).argmax(-1)
    if check:
        positions = torch.arange(valid.shape[-1], device=valid.device)
        span = (positions[None, :] >= first[:, None]) & (positions[None, :] < stored)
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
    layer = getattr(key, _TAG, None)
    if layer is not None:
        starts = mask_starts(attention_mask, layer.stored_tokens())
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
