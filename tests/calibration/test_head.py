"""OutputHead: KL and NLL from hidden states and fp's moments equal the full-logits values."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from kvtuner import KVTunerError, LayerSpec, QuantSpec
from kvtuner.calibration import fp_reference, measure_with_cache
from kvtuner.calibration.head import VOCAB_CHUNK, OutputHead
from kvtuner.calibration.kl import final_hidden
from kvtuner.runtime_loader.hf import make_cache


def _truth(head: OutputHead, fp_hidden, hidden, targets):
    """(Σ KL, Σ NLL) in fp64 over full logits: the definition the fused forms must meet."""
    w = head.weight.detach().double()
    b = None if head.bias is None else head.bias.detach().double()

    def log_softmax(h):
        z = torch.nn.functional.linear(h.double(), w, b)
        return torch.log_softmax(
            z if head.softcap is None else head.softcap * torch.tanh(z / head.softcap), -1
        )

    lp, lq = log_softmax(fp_hidden), log_softmax(hidden)
    kl = float((lp.exp() * (lp - lq)).sum())
    return kl, float(-lq.gather(-1, targets[..., None]).sum())


@pytest.mark.parametrize("bias", [False, True])
def test_chunked_head_matches_full_logits(bias):
    """A vocabulary of several chunks, with and without a bias: KL and NLL within fp32 rounding."""
    gen = torch.Generator().manual_seed(0)
    vocab, dim = 2 * VOCAB_CHUNK + 123, 64
    weight = torch.randn(vocab, dim, generator=gen) * 0.3
    head = OutputHead(weight, torch.randn(vocab, generator=gen) if bias else None)
    fp_hidden = torch.randn(2, 16, dim, generator=gen)
    hidden = fp_hidden + 0.05 * torch.randn(2, 16, dim, generator=gen)
    targets = torch.randint(0, vocab, (2, 16), generator=gen)
    log_probs = torch.log_softmax(head.logits(fp_hidden), -1)
    moments = head.moments(log_probs, fp_hidden)
    kl, nll = _truth(head, fp_hidden, hidden, targets)
    assert moments.expected_weight.shape == (2, 16, dim)
    assert math.isclose(head.kl_sum(moments, hidden), kl, rel_tol=1e-4)
    assert math.isclose(head.nll_sum(hidden, targets), nll, rel_tol=1e-6)
    assert head.kl_sum(moments, fp_hidden) == 0.0  # fp against itself, through the same code


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_reference_keeps_moments_not_vocab_sized_log_probs(family):
    model = tiny_model(family)
    ids = torch.randint(0, 256, (3, 64), generator=torch.Generator().manual_seed(0))
    ref = fp_reference(model, ids)
    assert ref.log_probs is None and ref.moments.expected_weight.shape == (3, 64, 128)
    n = model.config.num_hidden_layers
    # 8 bits: KL ~ 4e-7 per token, the size of fp32 rounding of one log-probability (eps * ln V),
    # which is where the fused form's cancellation leaves it (qwen2: 3.4e-7 against 4.1e-7)
    rounding = torch.finfo(torch.float32).eps * math.log(model.config.vocab_size)
    for bits, rel, abs_tol in ((2, 1e-4, 0.0), (4, 1e-3, 0.0), (8, 0.0, rounding)):
        specs = [LayerSpec(i, QuantSpec(bits), QuantSpec(bits)) for i in range(n)]
        kl, nll = measure_with_cache(
            model, ids, ref, lambda s=specs: make_cache(model, s), nll=True
        )
        with torch.inference_mode():
            hidden = final_hidden(model, ids, make_cache(model, specs))
            want = _truth(OutputHead.of(model), final_hidden(model, ids), hidden, ids)
        assert math.isclose(kl, want[0] / ids.numel(), rel_tol=rel, abs_tol=abs_tol)
        nll_want = _truth(OutputHead.of(model), hidden[:, :-1], hidden[:, :-1], ids[:, 1:])[1]
        assert math.isclose(nll, nll_want / (3 * 63), rel_tol=1e-6)


def test_soft_capped_head_keeps_log_probs():
    """Gemma 2's soft cap makes the head non-linear: the reference keeps fp's log-probs."""
    model = tiny_model("gemma3", final_logit_softcapping=5.0)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    ref = fp_reference(model, ids)
    assert ref.moments is None and ref.log_probs.shape == (2, 32, 256)
    with torch.inference_mode():
        assert torch.allclose(
            ref.head.logits(final_hidden(model, ids)), model(ids).logits, atol=1e-5
        )
    specs = [LayerSpec(i, QuantSpec(2), QuantSpec(2)) for i in range(3)]
    kl, _ = measure_with_cache(model, ids, ref, lambda: make_cache(model, specs))
    with torch.inference_mode():
        hidden = final_hidden(model, ids, make_cache(model, specs))
        want = _truth(ref.head, final_hidden(model, ids), hidden, ids)[0]
    assert math.isclose(kl, want / ids.numel(), rel_tol=1e-4)


def test_head_refuses_bad_shapes():
    with pytest.raises(KVTunerError, match="bias"):
        OutputHead(torch.zeros(8, 4), torch.zeros(7))
    with pytest.raises(KVTunerError, match="softcap"):
        OutputHead(torch.zeros(8, 4), None, softcap=0.0)
