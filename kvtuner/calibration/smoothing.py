"""Key smoothing calibration: per-layer, per-KV-head, per-channel key magnitudes -> λ.

Keys are read as the cache stores them (post-RoPE): a 16-bit kvtuner cache records every key
written during fp forwards of the calibration tokens. The magnitude of a channel is a high
quantile of |k| over all calibration tokens (the 0.99 quantile: on SmolLM2 it beat max|k| and
the RMS, see docs/results/key-smoothing.md); λ = magnitude^α scaled to geometric mean 1 per head.
"""

from __future__ import annotations

import torch

from ..placement import model_device
from ..profile import LayerSpec
from ..quant import QuantSpec
from ..quant.smoothing import KeySmoothing
from ..runtime_loader.hf.keyword import cache_kwargs
from .kl import sample_chunks

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_QUANTILE",
    "calibrate_key_smoothing",
    "key_magnitudes",
]

DEFAULT_ALPHA = 0.5
DEFAULT_QUANTILE = 0.99
_FP16 = QuantSpec(16)


def _recording(cache, seen: list[list[torch.Tensor]]):
    """Wrap each layer's ``update`` to keep |k| [H, D, B*T] of every key it stores (fp32, CPU)."""
    for i, layer in enumerate(cache.layers):

        def update(k, v, *args, _orig=layer.update, _i=i, **kwargs):
            seen[_i].append(k.detach().float().abs().permute(1, 3, 0, 2).flatten(2).cpu())
            return _orig(k, v, *args, **kwargs)

        layer.update = update


@torch.inference_mode()
def key_magnitudes(
    model,
    tokens: torch.Tensor,
    *,
    quantile: float = DEFAULT_QUANTILE,
    batch_size: int | None = None,
) -> list[torch.Tensor]:
    """Per layer fp32 [kv_heads, head_dim]: the ``quantile`` of |k| over the calibration tokens
    (int64 [N, T]) as the cache stores them (post-RoPE)."""
    from ..models import fingerprint_of
    from ..runtime_loader.hf import make_cache

    layers = fingerprint_of(model).num_layers
    seen: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    vocab = model.config.get_text_config().vocab_size
    for rows in sample_chunks(tokens, vocab, batch_size):
        cache = make_cache(model, [LayerSpec(i, _FP16, _FP16) for i in range(layers)])
        _recording(cache, seen)
        model(tokens[rows].to(model_device(model)), **cache_kwargs(cache), use_cache=True)
    if quantile == 1.0:  # the peak; torch.quantile refuses inputs over 2**24 elements
        return [torch.cat(s, -1).amax(-1) for s in seen]
    return [torch.quantile(torch.cat(s, -1), quantile, dim=-1) for s in seen]


def calibrate_key_smoothing(
    model,
    tokens: torch.Tensor,
    *,
    alpha: float = DEFAULT_ALPHA,
    quantile: float = DEFAULT_QUANTILE,
    batch_size: int | None = None,
) -> tuple[KeySmoothing, ...]:
    """One :class:`KeySmoothing` per layer: λ = quantile(|k|)^α, geometric mean 1 per head."""
    mags = key_magnitudes(model, tokens, quantile=quantile, batch_size=batch_size)
    return tuple(KeySmoothing.from_magnitudes(m, alpha) for m in mags)
