"""HF transformers runtime: a per-layer packed K/V cache built from a kvtuner profile."""

from .attention import kvtuner_attention, use_kvtuner_attention
from .cache import KVTunerCache, layer_specs_for, make_cache
from .keyword import cache_keyword, cache_kwargs
from .layer import KVTunerLayer
from .stream import PackedStream

__all__ = [
    "KVTunerCache",
    "KVTunerLayer",
    "PackedStream",
    "cache_keyword",
    "cache_kwargs",
    "kvtuner_attention",
    "layer_specs_for",
    "make_cache",
    "use_kvtuner_attention",
]
