"""The cache keyword kvtuner passes is the one the installed transformers declares (pyproject's
filterwarnings turns the old name's FutureWarning into an error on transformers >= 5.24)."""

import inspect

import torch

from kvtuner import LayerSpec, QuantSpec
from kvtuner.runtime_loader.hf import cache_keyword, cache_kwargs, make_cache


def test_the_keyword_is_a_parameter_of_the_model_and_its_layers(tiny_any):
    name = cache_keyword()
    assert name in ("cache", "past_key_values")
    for fn in (type(tiny_any).forward, type(tiny_any.model.layers[0]).forward):
        assert name in inspect.signature(fn).parameters, fn


def test_generate_fills_the_cache_passed_by_it(tiny_llama):
    layers = tiny_llama.config.num_hidden_layers
    cache = make_cache(
        tiny_llama, [LayerSpec(i, QuantSpec(4), QuantSpec(4)) for i in range(layers)]
    )
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    tiny_llama.generate(
        ids, **cache_kwargs(cache), max_new_tokens=4, min_new_tokens=4, do_sample=False
    )
    assert cache.get_seq_length() == 15  # 12 prompt tokens + 3 fed back (the 4th is not stored)
