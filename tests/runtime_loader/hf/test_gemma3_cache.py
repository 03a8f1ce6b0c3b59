"""Tier 2: the real Gemma 3 270M through the packed cache, past its 512-token window."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvtuner import ModelFingerprint, Profile, QuantSpec
from kvtuner.runtime_loader.hf import cache_kwargs, make_cache

pytestmark = pytest.mark.slow
PREFILL, DECODE = 516, 6  # the prefill already overflows the 512-token window; decoding goes on


@torch.no_grad()
def feed(model, cache, ids: torch.Tensor) -> list[torch.Tensor]:
    logits = [model(ids[:, :PREFILL], **cache_kwargs(cache), logits_to_keep=1).logits]
    for t in range(PREFILL, ids.shape[1]):
        logits.append(model(ids[:, t : t + 1], **cache_kwargs(cache)).logits)
    return logits


def test_16bit_profile_reproduces_the_default_cache_past_the_window(gemma3):
    model, _ = gemma3
    ids = torch.randint(
        10, 20_000, (1, PREFILL + DECODE), generator=torch.Generator().manual_seed(0)
    )
    fp = ModelFingerprint.from_config(model.config)
    ref = feed(model, DynamicCache(config=model.config), ids)
    cache = make_cache(model, Profile.uniform("gemma3-270m", fp, QuantSpec(16), QuantSpec(16)))
    assert all(torch.equal(a, b) for a, b in zip(ref, feed(model, cache, ids), strict=True))
    # window layers hold 511 tokens, global ones all 522; fp16 accounting
    assert cache.nbytes() == cache.fp16_nbytes(ids.shape[1]) == 2 * 256 * 2 * (15 * 511 + 3 * 522)
    profile = Profile.uniform("gemma3-270m", fp, QuantSpec(4, 32), QuantSpec(4, 32))
    packed = make_cache(model, profile)
    feed(model, packed, ids)
    assert (
        packed.nbytes() == packed.predicted_nbytes(ids.shape[1]) == profile.kv_bytes(ids.shape[1])
    )
