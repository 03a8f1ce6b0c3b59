"""Sliding-window layers in make_cache: transformers' semantics, window-capped packed storage."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache

from kvtuner import KVTunerError, LayerSpec, ModelFingerprint, Profile, QuantSpec, quantize
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

WINDOW = 8  # tiny_model("gemma3"): layers 0, 1 sliding (window 8), layer 2 global


def uniform(model, k: QuantSpec, v: QuantSpec) -> Profile:
    return Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def feed(model, cache, ids: torch.Tensor, prefill: int) -> list[torch.Tensor]:
    """Prefill ``ids[:, :prefill]``, then the rest one token at a time; every logits tensor."""
    logits = [model(ids[:, :prefill], **cache_kwargs(cache)).logits]
    for t in range(prefill, ids.shape[1]):
        logits.append(model(ids[:, t : t + 1], **cache_kwargs(cache)).logits)
    return logits


@pytest.mark.parametrize("family", ["gemma3", "mistral"])  # hybrid; every layer sliding
@pytest.mark.parametrize("prefill,residual_length", [(5, 0), (13, 0), (13, 3)])
def test_16bit_profile_reproduces_default_cache_past_the_window(family, prefill, residual_length):
    model = tiny_model(family, sliding_window=WINDOW)
    ids = tokens(2, prefill + 2 * WINDOW)  # decoding runs well beyond the window
    ref = feed(model, DynamicCache(config=model.config), ids, prefill)
    profile = uniform(model, QuantSpec(16), QuantSpec(16))
    cache = make_cache(model, profile, residual_length=residual_length)
    got = feed(model, cache, ids, prefill)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert cache.get_seq_length() == ids.shape[1]


@pytest.mark.parametrize("keep_dequantized", [False, True])
def test_window_layer_keeps_only_the_window_packed(keep_dequantized):
    model = tiny_model("gemma3")
    ids = tokens(1, 30)
    ref = DynamicCache(config=model.config)
    feed(model, ref, ids, 13)
    profile = uniform(model, QuantSpec(4, 16), QuantSpec(4, 16))
    cache = make_cache(model, profile, keep_dequantized=keep_dequantized)
    feed(model, cache, ids, 13)
    window_layer, global_layer = cache.layers[0], cache.layers[2]
    assert window_layer.k.packed.shape[-2] == WINDOW - 1 and window_layer.k.tail_tokens == 0
    assert global_layer.k.packed.shape[-2] == ids.shape[1]
    # layer 0's keys do not depend on the cache: its rows are exactly the newest keys, packed
    assert torch.equal(window_layer.k.packed, quantize(ref.layers[0].keys, profile.layers[0].k))
    if keep_dequantized:
        assert window_layer.k.deq.shape[-2] == WINDOW - 1
    assert cache.nbytes() == cache.predicted_nbytes(30) == profile.kv_bytes(30)


def test_predicted_bytes_with_a_residual_window_and_16bit_layers():
    model = tiny_model("gemma3")
    layers = (
        LayerSpec(0, QuantSpec(16), QuantSpec(2, 16)),
        LayerSpec(1, QuantSpec(4, 16), QuantSpec(8, 32)),
        LayerSpec(2, QuantSpec(4, 16, axis="channel"), QuantSpec(4, 16)),
    )
    fp = ModelFingerprint.from_config(model.config)
    for residual_length, pack_chunk in ((0, 1), (3, 1), (2, 4)):
        cache = make_cache(model, layers, residual_length=residual_length, pack_chunk=pack_chunk)
        ids = tokens(2, 27)
        with torch.no_grad():
            for start, stop in [(0, 6)] + [(t, t + 1) for t in range(6, 27)]:
                model(ids[:, start:stop], **cache_kwargs(cache))
                assert cache.nbytes() == cache.predicted_nbytes(stop, batch=2)
        assert cache.fp16_nbytes(27, capped=False) == fp.fp16_bytes_per_token * 27
        assert cache.fp16_nbytes(27) == fp.fp16_layer_bytes_per_token * (7 + 7 + 27)


def test_channel_axis_on_a_window_layer_is_one_line_error():
    model = tiny_model("gemma3")
    with pytest.raises(KVTunerError, match="layer 0 k: a sliding-window") as info:
        make_cache(model, uniform(model, QuantSpec(4, 16, axis="channel"), QuantSpec(4)))
    assert "\n" not in str(info.value)


def test_profile_for_another_layout_is_refused_in_one_line():
    hybrid, full = tiny_model("gemma3"), tiny_model("gemma3", layer_types=["full_attention"] * 3)
    other_window = tiny_model("gemma3", sliding_window=16)
    profile = uniform(hybrid, QuantSpec(4), QuantSpec(4))
    for model in (full, other_window):
        with pytest.raises(KVTunerError, match="layout is SSF") as info:
            make_cache(model, profile)
        assert "\n" not in str(info.value)
