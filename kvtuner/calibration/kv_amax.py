"""Per-layer amax of what the KV cache stores: the source of FP8/NVFP4 per-layer scales."""

from __future__ import annotations

from typing import Any

import torch

from ..placement import model_device
from ..runtime_loader.hf.keyword import cache_kwargs

__all__ = ["kv_amax"]


@torch.inference_mode()
def kv_amax(model: Any, tokens: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(k_amax, v_amax): per layer, the largest |K| and |V| the cache holds after fp forwards
    over ``tokens`` (int64 [samples, seq]), one window at a time: keys after RoPE, as engines
    store them (ModelOpt's ``max`` calibration of its k/v bmm quantizers sees the same tensors)."""
    from transformers import DynamicCache

    peaks = []  # [windows][layers] of (max |k|, max |v|)
    for row in tokens:
        cache = DynamicCache()  # every layer keeps every token (no window cropping)
        model(row[None].to(model_device(model)), **cache_kwargs(cache), use_cache=True)
        peaks.append([(lay.keys.abs().max().item(), lay.values.abs().max().item())
                      for lay in cache.layers])  # fmt: skip
    k_amax = tuple(max(w[i][0] for w in peaks) for i in range(len(peaks[0])))
    v_amax = tuple(max(w[i][1] for w in peaks) for i in range(len(peaks[0])))
    return k_amax, v_amax
