"""Perplexity and KL(fp || config) of several caches on the same windows, window-major.

The search minimises KL on calibration windows; the quality table reports perplexity on test
windows. Both can disagree (a config can move the true token's log-prob toward fp's while the
rest of the distribution moves away), so the benchmarks score both on the test windows. KL needs
fp's log-probs [T-1, V] for the window being scored: one fp forward per window, dropped after all
configs have read it (32 windows of Qwen2.5's 152k vocab would not fit in memory at once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..calibration.kl import kl_sum
from .data import EvalWindows
from .perplexity import PerplexityResult

__all__ = ["WindowScores", "mean_se", "window_scores"]


@dataclass(frozen=True)
class WindowScores:
    """One config on every window: summed NLL, mean KL(fp || config) per predicted token, and
    the share of positions whose greedy (argmax) token is fp's (what greedy decoding keeps)."""

    result: PerplexityResult
    kl: tuple[float, ...]
    top1_agree: tuple[float, ...]

    def divergence_fields(self) -> dict[str, Any]:
        """Row fields: KL and top-1 agreement, mean ± standard error, and their per-window lists."""
        kl, kl_se = mean_se(self.kl)
        agree, agree_se = mean_se(self.top1_agree)
        return {"kl": round(kl, 6), "kl_se": round(kl_se, 6),
                "top1_agree": round(agree, 5), "top1_agree_se": round(agree_se, 5),
                "window_kl": [round(x, 6) for x in self.kl],
                "window_top1_agree": [round(x, 5) for x in self.top1_agree]}  # fmt: skip


@torch.inference_mode()
def window_scores(
    model: Any, windows: EvalWindows, caches: Sequence[tuple[str, Callable[[], Any]]]
) -> dict[str, WindowScores]:
    """Score "fp" and each ``(name, make_cache)`` on every window; ``make_cache()`` gives a fresh
    cache per window (None: the model's default cache)."""
    out: dict[str, tuple[list[float], list[float], list[float]]] = {"fp": ([], [], [])}
    out.update({name: ([], [], []) for name, _ in caches})
    per_token = windows.seq_len - 1
    for ids in tqdm(windows.tokens, desc="windows", unit="window"):
        fp_logits = model(ids[None]).logits[0, :-1]
        ref = torch.log_softmax(fp_logits.float(), dim=-1)
        fp_top1 = ref.argmax(-1)
        for name, make_cache in [("fp", None), *caches]:
            logits, kl = fp_logits, 0.0  # fp against itself
            if make_cache is not None:
                cache = make_cache()
                logits = model(ids[None], past_key_values=cache, use_cache=True).logits[0, :-1]
                kl = kl_sum(ref, logits) / per_token
            nll, agree, kls = out[name]
            nll.append(F.cross_entropy(logits.float(), ids[1:], reduction="sum").item())
            agree.append((logits.argmax(-1) == fp_top1).float().mean().item())
            kls.append(kl)
    return {
        name: WindowScores(PerplexityResult(tuple(nll), per_token), tuple(kls), tuple(agree))
        for name, (nll, agree, kls) in out.items()
    }


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error over windows (0 for a single window)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in values) / (len(values) - 1) / len(values))
