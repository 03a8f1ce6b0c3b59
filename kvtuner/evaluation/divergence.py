"""Perplexity and KL(fp || config) of several caches on the same windows, window-major.

The search minimises KL on calibration windows; the quality table reports perplexity on test
windows. The two can rank configs differently: a config that moves far from fp can still gain
perplexity on the positions where fp's own top-1 is wrong, so the scores here also split the NLL
change by that, and count how often the config keeps fp's greedy token. KL needs
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
from ..placement import model_device
from ..runtime_loader.hf.keyword import cache_kwargs
from .data import EvalWindows
from .perplexity import PerplexityResult, ppl_cache

__all__ = ["WindowScores", "add_divergence", "config_scores", "mean_se", "window_scores"]


@dataclass(frozen=True)
class WindowScores:
    """One config on every window: summed NLL, mean KL(fp || config) per predicted token, the
    share of positions whose greedy (argmax) token is fp's (what greedy decoding keeps), and the
    summed NLL over the ``fp_right`` positions where fp's argmax is the text's next token."""

    result: PerplexityResult
    kl: tuple[float, ...]
    top1_agree: tuple[float, ...]
    nll_fp_right: tuple[float, ...]
    fp_right: tuple[int, ...]

    def nll_split(self, fp: WindowScores) -> tuple[float, float]:
        """Mean NLL change vs ``fp`` (nats/token) where fp's top-1 is the text's token, and where
        it is not. KL counts every move away from fp as a loss; perplexity nets a gain on the
        second kind of position against a loss on the first."""
        right = sum(self.nll_fp_right) - sum(fp.nll_fp_right)
        total = sum(self.result.window_nll) - sum(fp.result.window_nll)
        n_right = sum(self.fp_right)
        n_wrong = len(self.fp_right) * self.result.tokens_per_window - n_right
        return right / max(1, n_right), (total - right) / max(1, n_wrong)

    def divergence_fields(self, fp: WindowScores | None = None) -> dict[str, Any]:
        """Row fields: KL and top-1 agreement, mean ± standard error, and their per-window lists;
        with ``fp``, the NLL change where fp's top-1 is right and where it is wrong."""
        kl, kl_se = mean_se(self.kl)
        agree, agree_se = mean_se(self.top1_agree)
        fields = {"kl": round(kl, 6), "kl_se": round(kl_se, 6),
                  "top1_agree": round(agree, 5), "top1_agree_se": round(agree_se, 5),
                  "window_kl": [round(x, 6) for x in self.kl],
                  "window_top1_agree": [round(x, 5) for x in self.top1_agree]}  # fmt: skip
        if fp is not None:
            right, wrong = self.nll_split(fp)
            share = sum(self.fp_right) / (len(self.fp_right) * self.result.tokens_per_window)
            fields.update(dnll_fp_right=round(right, 5), dnll_fp_wrong=round(wrong, 5),
                          fp_right_share=round(share, 4))  # fmt: skip
        return fields


@torch.inference_mode()
def window_scores(
    model: Any, windows: EvalWindows, caches: Sequence[tuple[str, Callable[[], Any]]]
) -> dict[str, WindowScores]:
    """Score "fp" and each ``(name, make_cache)`` on every window; ``make_cache()`` gives a fresh
    cache per window (None: the model's default cache)."""
    fields = ("nll", "kl", "top1_agree", "nll_fp_right", "fp_right")
    out = {name: {f: [] for f in fields} for name in ["fp", *(n for n, _ in caches)]}
    per_token = windows.seq_len - 1
    device = model_device(model)
    for ids in tqdm(windows.tokens, desc="windows", unit="window"):
        ids = ids.to(device)
        fp_logits = model(ids[None]).logits[0, :-1]
        ref = torch.log_softmax(fp_logits.float(), dim=-1)
        fp_top1 = ref.argmax(-1)
        fp_right = fp_top1 == ids[1:]  # [T-1]
        for name, make_cache in [("fp", None), *caches]:
            logits, kl = fp_logits, 0.0  # fp against itself
            if make_cache is not None:
                cache = make_cache()
                logits = model(ids[None], **cache_kwargs(cache), use_cache=True).logits[0, :-1]
                kl = kl_sum(ref, logits) / per_token
            token_nll = F.cross_entropy(logits.float(), ids[1:], reduction="none")  # [T-1]
            row = out[name]
            row["nll"].append(token_nll.double().sum().item())
            row["kl"].append(kl)
            row["top1_agree"].append((logits.argmax(-1) == fp_top1).float().mean().item())
            row["nll_fp_right"].append(token_nll[fp_right].double().sum().item())
            row["fp_right"].append(int(fp_right.sum()))
    return {name: _scores(row, per_token) for name, row in out.items()}


def _scores(row: dict[str, list], per_token: int) -> WindowScores:
    result = PerplexityResult(tuple(row.pop("nll")), per_token)
    return WindowScores(result, **{field: tuple(values) for field, values in row.items()})


def config_scores(
    model: Any, windows: EvalWindows, configs: Sequence[Any]
) -> dict[str, WindowScores]:
    """:func:`window_scores` of evaluation rows (``EvalConfig``), each with the cache
    ``perplexity`` gives it (residual 0)."""
    return window_scores(
        model, windows, [(c.name, lambda c=c: ppl_cache(c, model)) for c in configs]
    )


def add_divergence(report: Any, model: Any, windows: EvalWindows, configs: Sequence[Any]) -> None:
    """Add KL, top-1 agreement and the NLL split vs fp to each row of an ``EvalReport`` measured
    on ``windows`` (one more window-major pass: fp and every config's fresh cache per window)."""
    scores = config_scores(model, windows, configs)
    for row in report.rows:
        row.update(scores[row["name"]].divergence_fields(scores["fp"]))


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and its standard error over windows (0 for a single window)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in values) / (len(values) - 1) / len(values))
