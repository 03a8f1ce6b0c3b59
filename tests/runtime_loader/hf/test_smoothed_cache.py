"""Key smoothing in the HF cache: packed rows hold k / λ, reads multiply back, and the fused
decode kernel (q·λ) reads them like the dequantized path."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers.cache_utils import Cache, DynamicLayer

import kvtuner.attention.decode as fused_decode
from kvtuner import LayerSpec, ModelFingerprint, Profile, QuantSpec, fake_quantize
from kvtuner.calibration.smoothing import calibrate_key_smoothing, key_magnitudes
from kvtuner.quant import KeySmoothing, quantize
from kvtuner.runtime_loader.hf import (
    cache_keyword,
    cache_kwargs,
    make_cache,
    use_kvtuner_attention,
)


def _lams(model, alpha=1.0):
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    return calibrate_key_smoothing(model, ids, alpha=alpha)


K4 = QuantSpec(4)


def _specs(lams, k=K4, v=K4):
    return [LayerSpec(i, k, v, lam) for i, lam in enumerate(lams)]


class _FakeQuantLayer(DynamicLayer):
    """The definition, spelled out: keys fake-quantized as fp32(k) / λ, times λ."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.spec = spec

    def update(self, k, v, *args, **kwargs):
        lam = self.spec.k_smooth.tensor()[None, :, None, :]
        k_hat = (fake_quantize(k.float() / lam, self.spec.k) * lam).to(k.dtype)
        return super().update(k_hat, fake_quantize(v, self.spec.v))


def test_key_magnitudes_are_the_post_rope_key_quantiles(tiny_llama):
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    out = tiny_llama(ids, use_cache=True)
    keys = getattr(out, cache_keyword()).layers[0].keys  # [B, H, T, D], the default cache
    want = torch.quantile(keys.abs().permute(1, 3, 0, 2).flatten(2), 0.99, dim=-1)
    torch.testing.assert_close(key_magnitudes(tiny_llama, ids)[0], want)


def test_smoothed_cache_gives_the_definitions_logits_exactly(tiny_llama):
    specs = _specs(_lams(tiny_llama))
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    got = tiny_llama(ids, **cache_kwargs(make_cache(tiny_llama, specs))).logits
    ref_cache = Cache(layers=[_FakeQuantLayer(s) for s in specs])
    assert torch.equal(got, tiny_llama(ids, **cache_kwargs(ref_cache)).logits)
    plain = make_cache(tiny_llama, [LayerSpec(s.layer, s.k, s.v) for s in specs])
    assert not torch.equal(got, tiny_llama(ids, **cache_kwargs(plain)).logits)


def test_packed_rows_are_the_smoothed_keys_and_bytes_are_unchanged(tiny_llama):
    lams = _lams(tiny_llama)
    cache = make_cache(tiny_llama, _specs(lams))
    k, v = torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)
    cache.layers[0].update(k, v)
    lam = lams[0].tensor()[None, :, None, :]
    assert torch.equal(cache.layers[0].k.packed, quantize(k / lam, QuantSpec(4)))
    assert 2 * cache.layers[0].nbytes() == cache.predicted_nbytes(9)  # two equal layers


@pytest.mark.parametrize(
    "cache_kw", [{"keep_dequantized": True}, {"residual_length": 4, "pack_chunk": 3}]
)
def test_working_copy_and_windows_read_the_same_smoothed_values(tiny_llama, cache_kw):
    specs = _specs(_lams(tiny_llama), k=QuantSpec(3, 16))
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    plain = tiny_llama.generate(ids, **cache_kwargs(make_cache(tiny_llama, specs)), **kw)
    other = tiny_llama.generate(
        ids, **cache_kwargs(make_cache(tiny_llama, specs, **cache_kw)), **kw
    )
    if "keep_dequantized" in cache_kw:  # same values, only kept instead of recomputed
        assert torch.equal(torch.stack(plain.logits), torch.stack(other.logits))
    assert other.sequences.shape == plain.sequences.shape


def test_fused_decode_reads_smoothed_rows_like_the_dequantized_path(monkeypatch):
    model = use_kvtuner_attention(tiny_model("llama"))
    fp = ModelFingerprint.from_config(model.config)
    lams = _lams(model)
    rotations = ("none", "hadamard")  # layer 1: smoothing, then the rotation (q·λ, then H)
    layers = [LayerSpec(i, QuantSpec(4, rotation=rotations[i]), K4, lams[i]) for i in range(2)]
    profile = Profile("tiny", fp, layers)
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True)

    def run(mode, **cache_kw):
        cache = make_cache(model, profile, decode_kernel=mode, **cache_kw)
        out = model.generate(ids, **cache_kwargs(cache), pad_token_id=0, **kw)
        return out.sequences, torch.stack(out.logits, 1)

    calls, real = [], fused_decode.decode_attention
    monkeypatch.setattr(
        fused_decode, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    for cache_kw in ({}, {"residual_length": 3}):  # the tail is divided by λ too
        ref, got = run("never", **cache_kw), run("always", **cache_kw)
        assert torch.equal(got[0], ref[0])
        torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)
    assert len(calls) == 2 * 4 * 2


def test_smoothing_is_refused_on_channel_keys():
    lam = KeySmoothing(((1.0,) * 32,) * 2)
    with pytest.raises(Exception, match="quantized token-axis keys only"):
        LayerSpec(0, QuantSpec(4, axis="channel"), QuantSpec(4), lam)
