"""make_vllm_cache: a transformers ``Cache`` storing each layer as vLLM would under a plan:
skipped layers at the model's dtype, the others in the plan's vLLM format."""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import Cache, DynamicLayer

from ...errors import KVTunerError
from ...profile import ModelFingerprint
from .vllm_layer import VllmFormatLayer

__all__ = ["make_vllm_cache"]


def make_vllm_cache(model: Any, plan: Any) -> Cache:
    """``plan``: a :class:`~kvtuner.runtime_loader.vllm.VllmPlan` for ``model``'s layer count.
    Pass the cache as ``past_key_values``; every token (prefill included) is stored, then read
    back, the way vLLM's cache holds it."""
    config = getattr(model, "config", model)
    fp = ModelFingerprint.from_config(config)
    if plan.num_layers != fp.num_layers:
        raise KVTunerError(f"plan has {plan.num_layers} layers, the model {fp.num_layers}")
    layers = []
    for i in range(fp.num_layers):
        fmt = plan.layer_format(i)
        layers.append(DynamicLayer() if fmt is None else VllmFormatLayer(fmt))
    return Cache(layers=layers)
