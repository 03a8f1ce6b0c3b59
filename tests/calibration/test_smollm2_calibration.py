"""Real SmolLM2-135M on real WikiText-2 text (slow tier, runs in CI)."""

from __future__ import annotations

import math

import pytest
import torch

from kvtuner import LayerSpec, QuantSpec
from kvtuner.calibration import fingerprint_of, load_calibration_data, measure_kl
from kvtuner.calibration.runner import capture_fp
from kvtuner.calibration.sweep import PER_TOKEN_KEY, PER_TOKEN_VALUE, measure_layer

pytestmark = pytest.mark.slow
FP16 = QuantSpec(16)


@pytest.fixture(scope="module")
def fp_run(smollm2):
    model, tokenizer = smollm2
    data = load_calibration_data(tokenizer, num_samples=2, seq_len=128, seed=0)
    with torch.inference_mode():
        return model, data, capture_fp(model, data.tokens)


def test_fp_reference_is_sane(fp_run):
    model, data, fp = fp_run
    assert fingerprint_of(model).num_layers == 30 and data.tokens.shape == (2, 128)
    assert 5 < fp.reference.ppl < 100  # fp32 SmolLM2 on WikiText-2: tens, not thousands


def test_k2_is_measurably_worse_than_k8_and_matches_the_full_model(fp_run):
    model, data, fp = fp_run
    layer = 27  # near the top: the shortcut runs 2 layers, the check one full forward
    entry = measure_layer(model, fp, layer, (2, 8), PER_TOKEN_KEY, PER_TOKEN_VALUE)
    k2, k8 = entry["k"]["2"]["kl"], entry["k"]["8"]["kl"]
    assert k2 > 100 * k8 and k8 > 0
    assert entry["k"]["2"]["attn_rel_err"] > 10 * entry["k"]["8"]["attn_rel_err"]
    assert entry["v"]["2"]["kl"] > 100 * entry["v"]["8"]["kl"]
    # The shortcut (start at layer l from cached fp activations, batched variants) gives the
    # number a full quantized forward through the packed cache gives.
    key2 = QuantSpec(2, 32, rotation="hadamard")
    specs = [LayerSpec(i, key2 if i == layer else FP16, FP16) for i in range(30)]
    full = measure_kl(model, data.tokens, specs, fp.reference)
    assert math.isclose(k2, full, rel_tol=1e-3)
