"""fp_reference / measure_kl through the HF runtime's packed cache on tiny models."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from kvtuner import KVTunerError, LayerSpec, QuantSpec
from kvtuner.calibration import fp_reference, measure_kl
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache


def specs(model, k_bits, v_bits, **kw):
    n = model.config.num_hidden_layers
    return [LayerSpec(i, QuantSpec(k_bits, **kw), QuantSpec(v_bits, **kw)) for i in range(n)]


def tokens(n=3, t=64, seed=0):
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_16_bits_leaves_logits_identical_and_kl_zero(family):
    model, ids = tiny_model(family), tokens()
    with torch.inference_mode():
        ref_logits = model(ids, use_cache=False).logits
        cache = make_cache(model, specs(model, 16, 16), residual_length=0)
        assert torch.equal(model(ids, **cache_kwargs(cache)).logits, ref_logits)
    ref = fp_reference(model, ids)
    assert measure_kl(model, ids, specs(model, 16, 16), ref) == 0.0


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_fewer_bits_cost_more_kl(family):
    model, ids = tiny_model(family), tokens()
    ref = fp_reference(model, ids)
    kl = {b: measure_kl(model, ids, specs(model, b, b), ref) for b in (2, 4, 8)}
    assert kl[2] > kl[4] > kl[8] > 0.0
    assert measure_kl(model, ids, specs(model, 2, 16), ref) < kl[2]


def test_fp_reference_moments_and_ppl():
    model, ids = tiny_model("llama"), tokens(2, 32)
    ref = fp_reference(model, ids)
    assert ref.moments.mass.shape == (2, 32) and ref.moments.expected_weight.dtype == torch.float32
    assert torch.allclose(ref.moments.mass, torch.ones(2, 32, dtype=torch.float64), atol=1e-5)
    loss = torch.nn.functional.cross_entropy(
        model(ids).logits[:, :-1].reshape(-1, 256), ids[:, 1:].reshape(-1)
    )
    assert math.isclose(ref.nll, loss.item(), rel_tol=1e-5)
    assert math.isclose(ref.ppl, math.exp(loss.item()), rel_tol=1e-5)


def test_reference_must_match_tokens():
    model = tiny_model("llama")
    ref = fp_reference(model, tokens(seed=0))
    with pytest.raises(KVTunerError, match="different tokens"):
        measure_kl(model, tokens(seed=1), specs(model, 4, 4), ref)
