"""window_scores(): per-window NLL and KL(fp || config), window-major, on a tiny model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvtuner import ModelFingerprint
from kvtuner.evaluation import EvalConfig, EvalWindows, parse_uniform, perplexity
from kvtuner.evaluation.divergence import config_scores, mean_se
from kvtuner.evaluation.perplexity import ppl_cache
from kvtuner.runtime_loader.hf import cache_kwargs


def windows(n: int = 3, t: int = 48) -> EvalWindows:
    gen = torch.Generator().manual_seed(5)
    return EvalWindows("synthetic", n, t, torch.randint(0, 256, (n, t), generator=gen))


def scored(model, names: str):
    configs = parse_uniform(names, ModelFingerprint.from_config(model.config))
    w = windows()
    return w, {c.name: c for c in configs}, config_scores(model, w, configs)


def test_nll_matches_the_row_by_row_perplexity(tiny_llama):
    w, configs, scores = scored(tiny_llama, "kv4,kivi2")
    fp = perplexity(tiny_llama, w.tokens, EvalConfig("fp", "fp"))
    assert scores["fp"].result.window_nll == pytest.approx(fp.window_nll, rel=1e-6)
    assert scores["fp"].kl == (0.0,) * w.num_windows
    assert scores["fp"].top1_agree == (1.0,) * w.num_windows
    for name, config in configs.items():
        row = perplexity(tiny_llama, w.tokens, config)
        assert scores[name].result.window_nll == pytest.approx(row.window_nll, rel=1e-6)


def test_kl_is_the_mean_per_predicted_token_kl_against_fp(tiny_llama):
    w, configs, scores = scored(tiny_llama, "kv2")
    ids = w.tokens[1]
    with torch.no_grad():
        ref = F.log_softmax(tiny_llama(ids[None]).logits[0, :-1].float(), dim=-1)
        cache = ppl_cache(configs["kv2"], tiny_llama)
        out = tiny_llama(ids[None], **cache_kwargs(cache), use_cache=True).logits[0, :-1]
    q = F.log_softmax(out.float(), dim=-1)
    want = F.kl_div(q, ref, log_target=True, reduction="sum").item() / (w.seq_len - 1)
    assert scores["kv2"].kl[1] == pytest.approx(want, rel=1e-4)
    assert want > 1e-4


def test_kl_grows_as_bits_shrink(tiny_llama):
    _, _, scores = scored(tiny_llama, "kv16,kv8,kv2")
    kl = {name: mean_se(scores[name].kl)[0] for name in ("kv16", "kv8", "kv2")}
    # each halving of the bits costs far more than the one before (kv16: fp16 storage)
    assert kl["kv16"] < kl["kv8"] / 10 and kl["kv8"] < kl["kv2"] / 10


def test_mean_se():
    assert mean_se([2.0]) == (2.0, 0.0)
    m, se = mean_se([1.0, 2.0, 3.0])
    assert (m, se) == (2.0, pytest.approx((1.0 / 3.0) ** 0.5))


def test_top1_agreement_counts_positions_whose_argmax_is_fps(tiny_llama):
    w, configs, scores = scored(tiny_llama, "kv2")
    ids = w.tokens[0]
    with torch.no_grad():
        fp_top1 = tiny_llama(ids[None]).logits[0, :-1].argmax(-1)
        cache = ppl_cache(configs["kv2"], tiny_llama)
        out = tiny_llama(ids[None], **cache_kwargs(cache), use_cache=True)
    top1 = out.logits[0, :-1].argmax(-1)
    want = (top1 == fp_top1).float().mean().item()
    assert scores["kv2"].top1_agree[0] == pytest.approx(want)
    fields = scores["kv2"].divergence_fields()
    assert fields["window_top1_agree"][0] == pytest.approx(want, abs=1e-5)
    assert 0.0 <= fields["top1_agree"] <= 1.0


def test_nll_split_adds_up_to_the_whole_nll_change(tiny_llama):
    w, _, scores = scored(tiny_llama, "kv2")
    fp, q = scores["fp"], scores["kv2"]
    right, wrong = q.nll_split(fp)
    n_right = sum(fp.fp_right)
    n_all = w.num_windows * (w.seq_len - 1)
    total = (sum(q.result.window_nll) - sum(fp.result.window_nll)) / n_all
    assert 0 < n_right < n_all
    assert (right * n_right + wrong * (n_all - n_right)) / n_all == pytest.approx(total, rel=1e-6)
    assert fp.nll_split(fp) == (0.0, 0.0)
    fields = q.divergence_fields(fp)
    assert fields["fp_right_share"] == pytest.approx(n_right / n_all, abs=1e-4)
    assert (fields["dnll_fp_right"], fields["dnll_fp_wrong"]) == pytest.approx(
        (right, wrong), abs=1e-5
    )
