"""Confirmation: re-measure the study's finalists on calibration windows the study never saw and
keep the one that is best there (`held_back` picks those windows, `confirm_on_held_back` runs it).

Why: the study ranks configurations by KL on a few hundred tokens, where margins of a few percent
are noise (measured on SmolLM2: a g64 4-bit mix 3 % better than uniform on 512 calibration tokens
was 10 % worse on held-out text). Finalists = the best measured configurations plus the best
uniform one, so a noise-level win over uniform is caught.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import KVTunerError
from ..profile import LayerSpec
from .results import Measured

if TYPE_CHECKING:
    from ..calibration import CalibrationData

__all__ = [
    "CONFIRM_FINALISTS",
    "Confirmed",
    "confirm",
    "confirm_on_held_back",
    "finalists",
    "held_back",
]

CONFIRM_FINALISTS = 4  # best measured configurations re-measured (plus the best uniform one)


@dataclass(frozen=True)
class Confirmed:
    """A finalist and its KL on the confirmation tokens."""

    measured: Measured
    kl: float

    def __post_init__(self) -> None:
        if not self.kl >= 0.0:
            raise KVTunerError(f"confirmation KL must be a number >= 0, got {self.kl}")


def finalists(measured: Sequence[Measured], k: int = CONFIRM_FINALISTS) -> list[Measured]:
    """The ``k`` least-KL configurations and the best uniform one (if not among them)."""
    ranked = sorted(measured, key=lambda m: (m.kl, m.bytes_per_token, m.number))
    uniform = [m for m in ranked if len(set(m.choice)) == 1]
    unique = {m.number: m for m in ranked[:k] + uniform[:1]}
    return list(unique.values())


def confirm(
    candidates: Sequence[Measured], evaluate: Callable[[Sequence[LayerSpec]], float]
) -> list[Confirmed]:
    """Each candidate's KL from ``evaluate``, best first (ties: fewer bytes, earlier trial)."""
    done = [Confirmed(m, float(evaluate(m.specs))) for m in candidates]
    return sorted(done, key=lambda c: (c.kl, c.measured.bytes_per_token, c.measured.number))


def held_back(
    tokenizer: Any, dataset: str | None, data: CalibrationData, samples: int
) -> CalibrationData:
    """``samples`` calibration windows disjoint from ``data`` (same text, seed and length)."""
    from ..calibration import load_calibration_data

    return load_calibration_data(
        tokenizer,
        dataset=dataset,
        num_samples=samples,
        seq_len=data.seq_len,
        seed=data.seed,
        offset=data.num_samples,
    )


def confirm_on_held_back(
    lm: Any,
    measured: Sequence[Measured],
    held: CalibrationData,
    log: Callable[[str], None],
    *,
    batch_size: int | None = None,
) -> tuple[Confirmed, ...]:
    """Re-measure the finalists on the held-back windows (on ``lm``'s device), best first."""
    from ..calibration import fp_reference, measure_kl

    reference = fp_reference(lm, held.tokens, batch_size=batch_size)
    out = confirm(finalists(measured), lambda s: measure_kl(lm, held.tokens, s, reference))
    log(f"confirmation on {held.tokens.numel()} more calibration tokens (KL study -> confirm):")
    for c in out:
        m = c.measured
        log(f"  trial {m.number:>3} {m.origin or 'sampled':<22} {m.kl:.5g} -> {c.kl:.5g}")
    return tuple(out)
