"""KeyRope: pre-RoPE key storage for the HF cache (``QuantSpec.pre_rope``).

The model hands the cache keys after its rotary embedding: channel pair (j, j + R/2) of the key
at position p is rotated by p·f_j. A channel-axis group of 32 tokens then spans that rotation's
swing, not the channel's own magnitude. The cache rotates each key back to position 0 before
packing and forward again after unpacking, with the model's own frequencies f (the
``rotate_half`` layout of transformers' Llama-family models; the first R = 2·len(f) channels
rotate, the rest pass). Forward and back are the same rotation with opposite angles, so
attention sees the model's keys up to the quantization error, whatever the true positions were
(left padding only shifts every angle of a sequence by one constant).
"""

from __future__ import annotations

from typing import Any

import torch

from ...attention.rope import rope_rotate
from ...errors import KVTunerError

__all__ = ["KeyRope", "key_rope_of"]


class KeyRope:
    """Rotations by the positions of a layer's stored keys; ``inv_freq`` [R/2] (fp32)."""

    def __init__(self, inv_freq: torch.Tensor):
        if inv_freq.ndim != 1 or not len(inv_freq):
            raise KVTunerError("pre_rope keys need a 1-D tensor of rotary frequencies")
        self.inv_freq = inv_freq.detach().float()

    def rotate(self, x: torch.Tensor, start: int, *, forward: bool) -> torch.Tensor:
        """x [B, H, T, D] at positions start..start+T-1, rotated forward (as the model's RoPE)
        or back to position 0; computed in fp32, returned in x's dtype."""
        r = 2 * len(self.inv_freq)
        if r > x.shape[-1]:
            raise KVTunerError(f"rotary width {r} exceeds the keys' head_dim {x.shape[-1]}")
        return rope_rotate(x, self.inv_freq, start, forward=forward).to(x.dtype)


def _rotary_module(model: Any) -> Any:
    for name, module in model.named_modules():
        if name.endswith("rotary_emb"):
            return module
    return None


def key_rope_of(model: Any, layer: int) -> KeyRope:
    """The rotary frequencies decoder layer ``layer`` of a transformers model applies to its
    keys: the ``rotary_emb`` module's ``inv_freq``, or ``<layer type>_inv_freq`` where layer
    types differ (Gemma 3's sliding and full layers)."""
    module = _rotary_module(model) if hasattr(model, "named_modules") else None
    if module is None:
        raise KVTunerError(
            "pre_rope keys need the model itself (its rotary embedding module), not its config"
        )
    types = getattr(getattr(model, "config", None), "layer_types", None)
    freq = getattr(module, f"{types[layer]}_inv_freq", None) if types else None
    freq = getattr(module, "inv_freq", None) if freq is None else freq
    if not isinstance(freq, torch.Tensor):
        raise KVTunerError(f"pre_rope keys: no rotary frequencies (inv_freq) for layer {layer}")
    return KeyRope(freq)
