"""make_vllm_cache: a transformers ``Cache`` storing each layer as vLLM would under a plan (a
:class:`~kvtuner.runtime_loader.vllm.VllmPlan`: skipped layers at the model's dtype, the others
in its format; or an :class:`~kvtuner.quant.engine_recipe.EngineRecipe`: a format per layer)."""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import Cache, DynamicLayer

from ...errors import KVTunerError
from ...profile import ModelFingerprint
from .vllm_layer import VllmFormatLayer

__all__ = ["make_vllm_cache"]


def make_vllm_cache(model: Any, plan: Any) -> Cache:
    """``plan``: anything with ``num_layers`` (``model``'s) and ``layer_formats(layer)`` -> (K
    format, V format), None for the model's dtype. Pass the cache as ``past_key_values``; every
    token (prefill included) is stored, then read back, the way vLLM's cache holds it."""
    config = getattr(model, "config", model)
    fp = ModelFingerprint.from_config(config)
    if plan.num_layers != fp.num_layers:
        raise KVTunerError(f"plan has {plan.num_layers} layers, the model {fp.num_layers}")
    layers = []
    for i in range(fp.num_layers):
        formats = plan.layer_formats(i)
        layers.append(DynamicLayer() if formats == (None, None) else VllmFormatLayer(*formats))
    return Cache(layers=layers)
