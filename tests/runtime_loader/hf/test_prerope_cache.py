"""Pre-RoPE keys in make_cache (QuantSpec.pre_rope): the model's rotation undone before packing,
redone on read, at the right positions (prefill, decode, sliding windows, Gemma 3's two RoPEs)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import tiny_model
from test_sliding_cache import WINDOW, feed, tokens
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvtuner import KVTunerError, LayerSpec, ModelFingerprint, Profile, QuantSpec, quantize
from kvtuner.quant.reference import dequantize
from kvtuner.quant.smoothing import KeySmoothing
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache
from kvtuner.runtime_loader.hf.rope import KeyRope, key_rope_of

KIVI3 = QuantSpec(3, 8, axis="channel", pre_rope=True)


def profile_of(model, k: QuantSpec, v: QuantSpec) -> Profile:
    return Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)


def test_forward_rotation_is_the_models_rope_and_back_undoes_it():
    model = tiny_model("llama")
    x = torch.randn(2, 2, 7, 32, generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(5, 12)[None].expand(2, -1)
    cos, sin = model.model.rotary_emb(x, position_ids)
    _, want = apply_rotary_pos_emb(x, x, cos, sin)
    rope = key_rope_of(model, 0)
    assert torch.allclose(rope.rotate(x, 5, forward=True), want, atol=1e-5)
    back = rope.rotate(rope.rotate(x, 5, forward=True), 5, forward=False)
    assert torch.allclose(back, x, atol=1e-5)


def test_partial_rotary_width_leaves_the_other_channels_alone():
    rope = KeyRope(torch.tensor([1.0, 0.5, 0.25, 0.125]))  # rotates the first 8 of 16 channels
    x = torch.randn(1, 1, 3, 16)
    got = rope.rotate(x, 2, forward=True)
    assert torch.equal(got[..., 8:], x[..., 8:]) and not torch.allclose(got[..., :8], x[..., :8])
    with pytest.raises(KVTunerError, match="exceeds the keys' head_dim"):
        rope.rotate(torch.randn(1, 1, 3, 4), 0, forward=True)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_16bit_prerope_keys_reproduce_the_default_cache(family):
    model = tiny_model(family, **({"sliding_window": WINDOW} if family == "gemma3" else {}))
    ids = tokens(2, 9 + 2 * WINDOW)  # decode past the window: the window layers drop tokens
    ref = feed(model, DynamicCache(config=model.config), ids, 9)
    cache = make_cache(model, profile_of(model, QuantSpec(16, pre_rope=True), QuantSpec(16)))
    got = feed(model, cache, ids, 9)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(ref, got, strict=True))
    assert any(layer.first_position > 0 for layer in cache.layers) == (family == "gemma3")


@torch.no_grad()
def test_quantized_prerope_keys_are_the_packed_unrotated_keys():
    model = tiny_model("llama")
    ids = tokens(1, 24)
    ref = DynamicCache(config=model.config)
    feed(model, ref, ids, 16)  # the model's (post-RoPE) keys of every token
    cache = make_cache(model, profile_of(model, KIVI3, QuantSpec(4, 16)))
    feed(model, cache, ids, 16)
    layer, rope = cache.layers[0], key_rope_of(model, 0)  # layer 0: keys need no cache
    unrotated = rope.rotate(ref.layers[0].keys, 0, forward=False)
    assert torch.equal(layer.k.packed, quantize(unrotated[:, :, :24], KIVI3))
    want = rope.rotate(dequantize(layer.k.packed, KIVI3, 32), 0, forward=True)
    keys, _ = layer.history(torch.float32)
    assert torch.allclose(keys, want, atol=1e-6)
    assert cache.nbytes() == cache.predicted_nbytes(24)


@pytest.mark.slow
def test_prerope_keys_lose_less_than_post_rope_keys_on_smollm2(smollm2):
    """The reason the option exists, on the real model: 3-bit channel-axis keys (values left
    16-bit) stored pre-RoPE move the next-token distribution less than post-RoPE ones, on 2 x 512
    tokens of WikiText-2 test (measured: 0.0346 vs 0.0518, ratio 0.67 on AMD EPYC; one short
    repeated sentence, this test's earlier text, gave 0.0260 vs 0.0216 there while it passed on
    Intel Xeon: too few tokens to say)."""
    from kvtuner.evaluation import load_eval_windows

    model, tok = smollm2
    ids = load_eval_windows(tok, num_windows=2, seq_len=512).tokens
    with torch.no_grad():
        fp = torch.log_softmax(model(ids).logits, -1)

        def kl(k: QuantSpec) -> float:
            cache = make_cache(model, profile_of(model, k, QuantSpec(16)))
            lp = torch.log_softmax(model(ids, **cache_kwargs(cache)).logits, -1)
            return float((fp.exp() * (fp - lp)).sum(-1).mean())

        post, pre = kl(QuantSpec(3, 32, axis="channel")), kl(QuantSpec(3, 32, axis="channel",
                                                                      pre_rope=True))  # fmt: skip
    assert pre < 0.8 * post


def test_make_cache_needs_the_model_for_prerope_keys():
    model = tiny_model("llama")
    with pytest.raises(KVTunerError, match="need the model itself"):
        make_cache(model.config, profile_of(model, KIVI3, QuantSpec(4, 16)))


def test_fused_decode_takes_prerope_layers_it_can_rotate():
    """The kernel rotates power-of-two rotary widths of keys that are not Hadamard-rotated
    (tests/runtime_loader/hf/test_hf_attention.py runs it); other layers read the history."""
    model = tiny_model("llama")
    layer = make_cache(model, profile_of(model, KIVI3, QuantSpec(4, 16))).layers[0]
    assert layer._fusable()
    layer.rope = KeyRope(torch.ones(12))  # R = 24 of 32 channels: not a power of two
    assert not layer._fusable()
    hadamard = profile_of(model, replace(KIVI3, rotation="hadamard"), QuantSpec(4, 16))
    assert not make_cache(model, hadamard).layers[0]._fusable()
    plain = make_cache(model, profile_of(model, replace(KIVI3, pre_rope=False), QuantSpec(4, 16)))
    assert plain.layers[0].rope is None


def test_prerope_values_and_smoothed_prerope_keys_are_refused():
    with pytest.raises(KVTunerError, match="keys only"):
        LayerSpec(0, QuantSpec(4), QuantSpec(4, pre_rope=True))
    with pytest.raises(KVTunerError, match="do not combine"):
        LayerSpec(0, QuantSpec(4, pre_rope=True), QuantSpec(4), KeySmoothing(((1.0,) * 32,) * 2))
