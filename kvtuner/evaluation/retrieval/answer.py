"""Greedy answers through the packed cache, exactly as the HF runtime serves a request.

The prompt is prefilled in one forward into a fresh cache built like ``kvtuner generate`` builds
it (``make_cache(residual_length=r, pack_chunk=c)``), then the reply is decoded greedily from it.
What attention reads (see :mod:`kvtuner.runtime_loader.hf.stream`): during the prefill every
layer stores all T prompt tokens, packs the oldest ``T - r`` (rounded down to whole chunks of c
tokens for token-axis streams, to whole blocks of 32 tokens for channel-axis keys), and returns
the dequantized packed rows plus the unpacked tail; so the prefill's own attention already reads
the quantized K/V of every token but the newest r..r+c-1. Each decode step appends one token;
tokens leave the window c at a time. fp rows use transformers' default cache.
"""

from __future__ import annotations

from typing import Any

import torch

from ...placement import model_device
from ...runtime_loader.hf.keyword import cache_kwargs
from ..configs import EvalConfig
from .samples import Sample

__all__ = ["answer", "task_cache"]


def task_cache(model: Any, config: EvalConfig, *, residual_length: int, pack_chunk: int):
    """A fresh cache for one sample (None: the model's default cache, for fp)."""
    if config.kind == "fp":
        return None
    from ...runtime_loader.hf import make_cache

    return make_cache(model, config.specs, residual_length=residual_length, pack_chunk=pack_chunk)


@torch.inference_mode()
def answer(
    model: Any,
    tokenizer: Any,
    sample: Sample,
    config: EvalConfig,
    *,
    residual_length: int,
    pack_chunk: int,
) -> str:
    """The greedy reply (special tokens dropped) to ``sample``'s prompt under ``config``."""
    cache = task_cache(model, config, residual_length=residual_length, pack_chunk=pack_chunk)
    ids = torch.tensor([sample.ids], device=model_device(model))
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        **cache_kwargs(cache),
        max_new_tokens=sample.draw.max_new_tokens,
        do_sample=False,
        top_p=None,
        top_k=None,
        temperature=None,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
