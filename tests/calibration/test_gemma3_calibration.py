"""Real Gemma 3 270M (5 sliding : 1 global, 1 KV head, head_dim 256): alias, fingerprint and
calibration on real WikiText-2 text (slow tier, runs in CI)."""

from __future__ import annotations

import math

import pytest
import torch

from kvtuner import LayerSpec, QuantSpec
from kvtuner.calibration import (
    fingerprint_of,
    load_calibration_data,
    measure_kl,
    model_fingerprint,
)
from kvtuner.calibration.runner import capture_fp
from kvtuner.calibration.sweep import PER_TOKEN_KEY, PER_TOKEN_VALUE, measure_layer

pytestmark = pytest.mark.slow
FP16 = QuantSpec(16)
LAYOUT = "SSSSSFSSSSSFSSSSSF (S: sliding window 512, F: full)"


@pytest.fixture(scope="module")
def fp_run(gemma3):
    model, tokenizer = gemma3
    data = load_calibration_data(tokenizer, num_samples=1, seq_len=128, seed=0)
    with torch.inference_mode():
        return model, data, capture_fp(model, data.tokens)


def test_alias_fingerprint_records_the_hybrid_layout(gemma3):
    model, _ = gemma3
    fp = model_fingerprint("gemma3-270m")
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim) == (
        "Gemma3ForCausalLM",
        18,
        1,
        256,
    )
    assert fp.layout == LAYOUT and fp.hash == fingerprint_of(model).hash


def test_fp_reference_is_sane(fp_run):
    _, data, fp = fp_run
    assert data.tokens.shape == (1, 128) and data.prefix == (2,)
    assert bool((data.tokens[:, 0] == 2).all())  # Gemma's BOS leads every window
    assert 5 < fp.reference.ppl < 200  # a 270M model on WikiText-2: tens, not thousands


@pytest.mark.parametrize("layer", [4, 5])  # a sliding-window layer, then the first global one
def test_k2_is_worse_than_k8_and_the_shortcut_matches_the_full_model(fp_run, layer):
    model, data, fp = fp_run
    entry = measure_layer(model, fp, layer, (2, 8), PER_TOKEN_KEY, PER_TOKEN_VALUE)
    k2, k8 = entry["k"]["2"]["kl"], entry["k"]["8"]["kl"]
    assert k2 > 10 * k8 and k8 > 0
    assert entry["v"]["2"]["kl"] > 10 * entry["v"]["8"]["kl"]
    # starting at layer l from cached fp activations gives what a full packed-cache forward gives
    key2 = QuantSpec(2, 32, rotation="hadamard")
    specs = [LayerSpec(i, key2 if i == layer else FP16, FP16) for i in range(18)]
    full = measure_kl(model, data.tokens, specs, fp.reference)
    assert math.isclose(k2, full, rel_tol=1e-3)
