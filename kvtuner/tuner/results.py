"""What a study measured: feasible configurations with their KL, the best one, the Pareto set."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from ..profile import LayerSpec, Profile
from ..search_spaces import Pair, SearchSpace

__all__ = ["Measured", "best_measured", "measured_trials", "pareto_set"]


@dataclass(frozen=True)
class Measured:
    """One measured, budget-feasible configuration."""

    number: int
    origin: str
    choice: tuple[Pair, ...]
    specs: tuple[LayerSpec, ...]
    kl: float
    additive_kl: float
    nominal_bits: float
    effective_bits: float
    bytes_per_token: float

    @classmethod
    def of(cls, space: SearchSpace, choice, kl: float, number: int = -1, origin: str = ""):
        specs = space.layer_specs(choice)
        profile = Profile("", space.fingerprint, specs)
        additive = sum(space.loss(g, p) for g, p in enumerate(choice))
        return cls(
            number,
            origin,
            tuple(choice),
            specs,
            float(kl),
            additive,
            profile.nominal_bits,
            profile.effective_bits,
            profile.bytes_per_token,
        )


def measured_trials(study: optuna.Study, space: SearchSpace) -> list[Measured]:
    """Completed trials whose configuration fits the budget (re-checked, never trusted)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        choice = space.from_params(t.params)
        if space.fits(choice) and t.value is not None and t.value == t.value:  # not NaN
            out.append(
                Measured.of(space, choice, t.value, t.number, t.user_attrs.get("origin", ""))
            )
    return out


def best_measured(measured: list[Measured]) -> Measured | None:
    """Least measured KL; ties go to fewer bytes, then the earlier trial."""
    return min(measured, key=lambda m: (m.kl, m.bytes_per_token, m.number), default=None)


def pareto_set(measured: list[Measured]) -> list[Measured]:
    """Configurations no other one beats on both bytes per token and KL, fewest bytes first."""
    front, best = [], float("inf")
    for m in sorted(measured, key=lambda m: (m.bytes_per_token, m.kl, m.number)):
        if m.kl < best:
            front.append(m)
            best = m.kl
    return front
