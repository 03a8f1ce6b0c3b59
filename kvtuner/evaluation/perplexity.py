"""Perplexity, the evaluation protocol: each window one forward, K/V quantized before any query
reads them (prefill included: kvtuner's cache with ``residual_length=0``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import KVTunerError
from ..placement import model_device
from ..runtime_loader.hf.keyword import cache_kwargs
from .configs import EvalConfig

__all__ = ["PerplexityResult", "perplexity", "ppl_cache"]


@dataclass(frozen=True)
class PerplexityResult:
    """Per-window summed NLL (nats) over ``tokens_per_window`` predicted tokens each."""

    window_nll: tuple[float, ...]
    tokens_per_window: int

    @property
    def ppl(self) -> float:
        return math.exp(sum(self.window_nll) / (len(self.window_nll) * self.tokens_per_window))

    def delta_pct(self, ref: PerplexityResult) -> float:
        return 100.0 * (self.ppl / ref.ppl - 1.0)

    def per_token_nll(self) -> list[float]:
        """Each window's mean NLL per predicted token (nats)."""
        return [w / self.tokens_per_window for w in self.window_nll]

    def delta_se_pct(self, ref: PerplexityResult) -> float:
        """Standard error (in % of ppl) of the paired per-window difference: Δppl% ± this."""
        n = len(self.window_nll)
        if n < 2:
            return float("nan")
        d = [a - b for a, b in zip(self.per_token_nll(), ref.per_token_nll(), strict=True)]
        mean = sum(d) / n
        var = sum((x - mean) ** 2 for x in d) / (n - 1)
        return 100.0 * math.exp(mean) * math.sqrt(var / n)


def ppl_cache(config: EvalConfig, model: Any):
    """A fresh cache for one perplexity window (None: the model's default cache)."""
    if config.kind == "fp":
        return None
    if config.kind == "hf-quanto":
        from .quanto import quanto_ppl_cache

        return quanto_ppl_cache(model, config.quanto_bits)
    from ..runtime_loader.hf import make_cache

    return make_cache(model, config.specs, residual_length=0)


@torch.inference_mode()
def window_nll(model: Any, ids: torch.Tensor, cache: Any, score_last: int | None = None) -> float:
    """Summed next-token NLL of one window ids[T]: all T-1 predictions, or the last
    ``score_last`` (long context: the cache then holds T - score_last tokens before the first
    scored one; only those logits are computed)."""
    ids = ids.to(model_device(model))
    n = ids.shape[0] - 1 if score_last is None else score_last
    out = model(ids[None], **cache_kwargs(cache), use_cache=cache is not None, logits_to_keep=n + 1)
    return F.cross_entropy(out.logits[0, :-1].float(), ids[-n:], reduction="sum").item()


def perplexity(
    model: Any,
    windows: torch.Tensor,
    config: EvalConfig,
    *,
    on_window: Callable[[int, Any], None] | None = None,
    score_last: int | None = None,
) -> PerplexityResult:
    """Perplexity of ``windows`` [N, T] under ``config``; ``on_window(i, cache)`` after each.
    ``score_last``: score only each window's last that many tokens (None: all T - 1)."""
    if score_last is not None and not 0 < score_last < windows.shape[1]:
        raise KVTunerError(f"scored tokens must be in 1..{windows.shape[1] - 1}, got {score_last}")
    nll = []
    for i, ids in enumerate(windows):
        cache = ppl_cache(config, model)
        nll.append(window_nll(model, ids, cache, score_last))
        if on_window is not None:
            on_window(i, cache)
    return PerplexityResult(tuple(nll), score_last or windows.shape[1] - 1)
