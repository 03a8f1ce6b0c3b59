"""Confirmation: re-measure the study's finalists on calibration windows the study never saw and
keep the one that is best there (`held_back` picks those windows, `confirm_on_held_back` runs it).

Why: the study ranks configurations by KL on a few hundred tokens, where margins of a few percent
are noise (measured on SmolLM2: a g64 4-bit mix 3 % better than uniform on 512 calibration tokens
was 10 % worse on held-out text). Finalists = the best measured configurations plus the best
uniform one, so a noise-level win over uniform is caught.

The metric: ``kl`` (the study's own) or ``nll``, the text's next-token NLL, which is what
perplexity tables score. The two can disagree: a config may stay closer to fp (less KL) yet lose
perplexity where fp's top-1 is wrong (docs/results/qwen25.md, "When KL and perplexity disagree").
NLL margins between finalists are ~0.005 nats/token, so ``nll`` wants thousands of tokens (e.g.
16 windows of 1024); the log gives each finalist's paired difference to the best one ± its
standard error over the windows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import KVTunerError
from ..profile import LayerSpec
from .results import Measured

if TYPE_CHECKING:
    from ..calibration import CalibrationData

__all__ = [
    "CONFIRM_FINALISTS",
    "CONFIRM_METRICS",
    "Confirmed",
    "confirm",
    "confirm_on_held_back",
    "finalists",
    "held_back",
]

CONFIRM_FINALISTS = 4  # best measured configurations re-measured (plus the best uniform one)
CONFIRM_METRICS = ("kl", "nll")


@dataclass(frozen=True)
class Confirmed:
    """A finalist and its score on the confirmation tokens: mean KL(fp || it) per position
    (``kl``) or mean next-token NLL of the text in nats (``nll``); lower is better."""

    measured: Measured
    score: float
    metric: str = "kl"

    def __post_init__(self) -> None:
        if self.metric not in CONFIRM_METRICS:
            raise KVTunerError(f"confirmation metric must be one of {CONFIRM_METRICS}")
        if not self.score >= 0.0:
            raise KVTunerError(
                f"confirmation {self.metric} must be a number >= 0, got {self.score}"
            )


def finalists(measured: Sequence[Measured], k: int = CONFIRM_FINALISTS) -> list[Measured]:
    """The ``k`` least-KL configurations and the best uniform one (if not among them)."""
    ranked = sorted(measured, key=lambda m: (m.kl, m.bytes_per_token, m.number))
    uniform = [m for m in ranked if len(set(m.choice)) == 1]
    unique = {m.number: m for m in ranked[:k] + uniform[:1]}
    return list(unique.values())


def confirm(
    candidates: Sequence[Measured],
    evaluate: Callable[[Sequence[LayerSpec]], float],
    metric: str = "kl",
) -> list[Confirmed]:
    """Each candidate's score from ``evaluate``, best first (ties: fewer bytes, earlier trial)."""
    return _ranked(Confirmed(m, float(evaluate(m.specs)), metric) for m in candidates)


def _ranked(done: Iterable[Confirmed]) -> list[Confirmed]:
    """Best first; ties: fewer bytes, then the earlier trial."""
    return sorted(done, key=lambda c: (c.score, c.measured.bytes_per_token, c.measured.number))


def held_back(
    tokenizer: Any,
    dataset: str | None,
    data: CalibrationData,
    samples: int,
    seq_len: int | None = None,
) -> CalibrationData:
    """``samples`` windows of ``seq_len`` tokens (None: ``data``'s length) from the same text and
    seed, none sharing a token with ``data``'s windows."""
    from ..calibration import load_calibration_data

    return load_calibration_data(
        tokenizer,
        dataset=dataset,
        num_samples=samples,
        seq_len=seq_len or data.seq_len,
        seed=data.seed,
        disjoint_from=data,
    )


def confirm_on_held_back(
    lm: Any,
    measured: Sequence[Measured],
    held: CalibrationData,
    log: Callable[[str], None],
    *,
    metric: str = "kl",
    batch_size: int | None = None,
) -> tuple[Confirmed, ...]:
    """Re-measure the finalists on the held-back windows (on ``lm``'s device) by ``metric``,
    best first."""
    if metric not in CONFIRM_METRICS:
        raise KVTunerError(f"confirmation metric must be one of {CONFIRM_METRICS}, got {metric!r}")
    tokens = held.tokens.numel()
    if metric == "nll":
        log(f"confirmation on {tokens} more calibration tokens (KL study -> NLL of the text):")
        return tuple(_confirm_by_nll(lm, finalists(measured), held, log))
    from ..calibration import fp_reference, measure_kl

    reference = fp_reference(lm, held.tokens, batch_size=batch_size)
    out = confirm(finalists(measured), lambda s: measure_kl(lm, held.tokens, s, reference))
    log(f"confirmation on {tokens} more calibration tokens (KL study -> confirm):")
    for c in out:
        m = c.measured
        log(f"  trial {m.number:>3} {m.origin or 'sampled':<22} {m.kl:.5g} -> {c.score:.5g}")
    return tuple(out)


def _confirm_by_nll(
    lm: Any, candidates: Sequence[Measured], held: CalibrationData, log: Callable[[str], None]
) -> list[Confirmed]:
    """Each finalist's mean NLL of the held-back text, window-major (fp once per window), best
    first; logged with its perplexity change vs fp and its paired difference to the best."""
    from ..evaluation import EvalWindows
    from ..evaluation.divergence import mean_se, window_scores
    from ..runtime_loader.hf import make_cache

    windows = EvalWindows(held.dataset, held.num_samples, held.seq_len, held.tokens)
    caches = [
        (str(m.number), lambda m=m: make_cache(lm, m.specs, residual_length=0)) for m in candidates
    ]
    scores = window_scores(lm, windows, caches)
    nll = {m.number: scores[str(m.number)].result.per_token_nll() for m in candidates}
    out = _ranked(Confirmed(m, sum(nll[m.number]) / held.num_samples, "nll") for m in candidates)
    best = nll[out[0].measured.number]
    for c in out:
        m = c.measured
        diff, se = mean_se([a - b for a, b in zip(nll[m.number], best, strict=True)])
        change = scores[str(m.number)].result.delta_pct(scores["fp"].result)
        log(f"  trial {m.number:>3} {m.origin or 'sampled':<22} KL {m.kl:.5g}, ppl {change:+.2f} %"
            f" vs fp, NLL {diff:+.4f} ± {se:.4f} vs the best")  # fmt: skip
    return out
