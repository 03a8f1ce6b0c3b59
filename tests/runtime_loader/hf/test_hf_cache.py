"""make_cache on tiny in-process models: 16-bit exactness, packing, bytes, residual window."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache

from kvtuner import KVTunerError, LayerSpec, ModelFingerprint, Profile, QuantSpec, fake_quantize
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

FAMILIES = [("llama", {}), ("qwen2", {}), ("qwen3", {}), ("mistral", {"sliding_window": None})]


def uniform(model, k: QuantSpec, v: QuantSpec) -> Profile:
    return Profile.uniform("tiny", ModelFingerprint.from_config(model.config), k, v)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def forward_steps(model, cache, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Prefill ids, then feed `steps` greedy tokens one at a time; return every logits tensor."""
    out = model(ids, **cache_kwargs(cache))
    logits = [out.logits]
    for _ in range(steps):
        nxt = out.logits[:, -1:].argmax(-1)
        out = model(nxt, **cache_kwargs(cache))
        logits.append(out.logits)
    return logits


@pytest.mark.parametrize("family,overrides", FAMILIES)
@pytest.mark.parametrize("residual_length", [0, 5])
def test_16bit_profile_reproduces_default_cache_exactly(family, overrides, residual_length):
    model = tiny_model(family, **overrides)
    ids = tokens(2, 23)
    ref = forward_steps(model, DynamicCache(config=model.config), ids, 6)
    cache = make_cache(
        model, uniform(model, QuantSpec(16), QuantSpec(16)), residual_length=residual_length
    )
    got = forward_steps(model, cache, ids, 6)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_low_bits_change_logits_and_more_bits_change_them_less(tiny_llama):
    ids = tokens(1, 40)
    ref = tiny_llama(ids).logits
    err = {}
    for bits in (2, 8):
        cache = make_cache(tiny_llama, uniform(tiny_llama, QuantSpec(bits), QuantSpec(bits)))
        err[bits] = (tiny_llama(ids, **cache_kwargs(cache)).logits - ref).abs().max().item()
    assert err[2] > 10 * err[8] > 0


def test_residual_zero_quantizes_every_token_before_attention_reads_it(tiny_llama):
    spec = LayerSpec(0, QuantSpec(4, axis="channel"), QuantSpec(2, group_size=16))
    layer = make_cache(tiny_llama, [spec, LayerSpec(1, spec.k, spec.v)]).layers[0]
    k, v = torch.randn(2, 2, 70, 32), torch.randn(2, 2, 70, 32)  # 70 = 2 full blocks + 6
    got_k, got_v = layer.update(k, v)
    assert torch.equal(got_v, fake_quantize(v, spec.v))
    assert torch.equal(got_k, fake_quantize(k, spec.k))  # tail block on its own statistics
    assert layer.k.packed_tokens == 64 and layer.k.tail_tokens == 6
    assert layer.v.packed_tokens == 70 and layer.v.tail_tokens == 0


def test_residual_window_holds_exactly_the_last_n_tokens_unquantized(tiny_llama):
    n, ids = 7, tokens(2, 25)
    ref = DynamicCache(config=tiny_llama.config)
    cache = make_cache(
        tiny_llama, uniform(tiny_llama, QuantSpec(4), QuantSpec(2)), residual_length=n
    )
    for c in (ref, cache):  # same tokens for both: a 20-token prefill, then 5 single steps
        for chunk in (ids[:, :20], *ids[:, 20:].split(1, dim=1)):
            tiny_llama(chunk, **cache_kwargs(c))
    for i, layer in enumerate(cache.layers):
        assert layer.get_seq_length() == 25 and layer.k.packed_tokens == 25 - n
        # window tokens equal the default cache's states bit for bit only for the first layer
        # (later layers already saw quantized history); check shape everywhere, values at 0
        assert layer.k.tail.shape[-2] == layer.v.tail.shape[-2] == n
        if i == 0:
            assert torch.equal(layer.k.tail, ref.layers[0].keys[..., -n:, :])
            assert torch.equal(layer.v.tail, ref.layers[0].values[..., -n:, :])


def test_channel_keys_keep_a_filling_block_beyond_the_window(tiny_llama):
    spec = QuantSpec(4, group_size=8, axis="channel")
    cache = make_cache(tiny_llama, uniform(tiny_llama, spec, QuantSpec(4)), residual_length=4)
    forward_steps(tiny_llama, cache, tokens(1, 30), 3)  # 33 tokens: 24 packed, 9 in the tail
    assert cache.layers[0].k.packed_tokens == 24 and cache.layers[0].k.tail_tokens == 9
    assert cache.layers[0].v.packed_tokens == 29


@pytest.mark.parametrize(
    "k,v",
    [
        (QuantSpec(4), QuantSpec(2)),
        (QuantSpec(8, group_size=16, symmetric=True), QuantSpec(4, rotation="hadamard")),
        (QuantSpec(2, axis="channel"), QuantSpec(16)),
    ],
)
def test_packed_bytes_equal_the_profile_prediction(tiny_llama, k, v):
    profile = uniform(tiny_llama, k, v)
    cache = make_cache(tiny_llama, profile)
    tiny_llama(tokens(3, 64), **cache_kwargs(cache))
    assert cache.nbytes() == profile.bytes_per_token * 64 * 3 == cache.predicted_nbytes(64, 3)


def test_bytes_follow_the_prediction_during_decode_with_a_residual_window(tiny_llama):
    specs = [
        LayerSpec(0, QuantSpec(2, group_size=8, axis="channel"), QuantSpec(4)),
        LayerSpec(1, QuantSpec(8), QuantSpec(16)),
    ]
    cache = make_cache(tiny_llama, specs, residual_length=3)
    out = tiny_llama(tokens(2, 11), **cache_kwargs(cache))
    for step in range(12):
        assert cache.nbytes() == cache.predicted_nbytes(11 + step, 2)
        out = tiny_llama(out.logits[:, -1:].argmax(-1), **cache_kwargs(cache))
    assert cache.nbytes() < cache.fp16_nbytes(23, 2)


def test_mismatched_profile_is_rejected_with_one_line(tiny_llama):
    other = tiny_model("llama", num_hidden_layers=3)
    bad_layers = uniform(other, QuantSpec(4), QuantSpec(4))
    bad_heads = uniform(tiny_model("llama", num_key_value_heads=4), QuantSpec(4), QuantSpec(4))
    bad_dim = uniform(tiny_model("llama", head_dim=64), QuantSpec(4), QuantSpec(4))
    for profile, word in (
        (bad_layers, "num_layers"),
        (bad_heads, "num_kv_heads"),
        (bad_dim, "head_dim"),
    ):
        with pytest.raises(KVTunerError, match=word) as info:
            make_cache(tiny_llama, profile)
        assert "\n" not in str(info.value)
    with pytest.raises(KVTunerError, match="layers 0..1"):
        make_cache(tiny_llama, [LayerSpec(0, QuantSpec(4), QuantSpec(4))])
    with pytest.raises(KVTunerError, match="residual_length"):
        make_cache(tiny_llama, uniform(tiny_llama, QuantSpec(4), QuantSpec(4)), residual_length=-1)


def left_padded_batch():
    ids = tokens(3, 12)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def test_generate_batch_with_left_padding_16bit_is_token_identical(tiny_llama):
    ids, mask = left_padded_batch()
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    ref = tiny_llama.generate(ids, **kw)
    cache = make_cache(
        tiny_llama, uniform(tiny_llama, QuantSpec(16), QuantSpec(16)), residual_length=4
    )
    assert torch.equal(tiny_llama.generate(ids, **cache_kwargs(cache), **kw), ref)


@pytest.mark.parametrize("keep_dequantized", [False, True])
def test_generate_batch_with_left_padding_quantized(tiny_llama, keep_dequantized):
    ids, mask = left_padded_batch()
    kw = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0)
    profile = uniform(tiny_llama, QuantSpec(4, group_size=8, axis="channel"), QuantSpec(4))
    outs = []
    for keep in (keep_dequantized, not keep_dequantized):
        cache = make_cache(tiny_llama, profile, residual_length=8, keep_dequantized=keep)
        outs.append(tiny_llama.generate(ids, **cache_kwargs(cache), **kw))
        assert cache.get_seq_length() == 12 + 40 - 1
        assert cache.nbytes() == cache.predicted_nbytes(51, 3)
    assert outs[0].shape == (3, 52) and torch.equal(outs[0], outs[1])


def test_beam_search_reorders_packed_rows(tiny_llama):
    ids = tokens(2, 9)
    kw = dict(max_new_tokens=8, do_sample=False, num_beams=3, pad_token_id=0)
    ref = tiny_llama.generate(ids, **kw)
    cache = make_cache(tiny_llama, uniform(tiny_llama, QuantSpec(16), QuantSpec(16)))
    assert torch.equal(tiny_llama.generate(ids, **cache_kwargs(cache), **kw), ref)
    cache = make_cache(
        tiny_llama, uniform(tiny_llama, QuantSpec(8), QuantSpec(8)), residual_length=2
    )
    assert tiny_llama.generate(ids, **cache_kwargs(cache), **kw).shape == ref.shape


def test_pack_chunk_changes_nothing_with_residual_zero(tiny_llama):
    profile = uniform(tiny_llama, QuantSpec(4), QuantSpec(2, group_size=16))
    ids = tokens(2, 21)
    ref = forward_steps(tiny_llama, make_cache(tiny_llama, profile), ids, 9)
    chunked = make_cache(tiny_llama, profile, pack_chunk=8)
    got = forward_steps(tiny_llama, chunked, ids, 9)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))
    assert chunked.layers[0].k.tail_tokens == 30 % 8  # 30 cached tokens, 3 chunks packed
    assert chunked.nbytes() == chunked.predicted_nbytes(30, 2)


def test_pack_chunk_packs_in_chunks_beyond_the_window(tiny_llama):
    cache = make_cache(
        tiny_llama,
        uniform(tiny_llama, QuantSpec(8), QuantSpec(4)),
        residual_length=4,
        pack_chunk=8,
    )
    out = tiny_llama(tokens(1, 10), **cache_kwargs(cache))
    for step in range(20):
        seen = 10 + step
        tail = cache.layers[1].v.tail_tokens
        assert 4 <= tail < 4 + 8 and cache.layers[1].v.packed_tokens % 8 == 0
        assert cache.nbytes() == cache.predicted_nbytes(seen)
        out = tiny_llama(out.logits[:, -1:].argmax(-1), **cache_kwargs(cache))
    with pytest.raises(KVTunerError, match="pack_chunk"):
        make_cache(tiny_llama, uniform(tiny_llama, QuantSpec(8), QuantSpec(4)), pack_chunk=0)
