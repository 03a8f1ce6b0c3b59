"""What a study measured: feasible configurations with their KL, the best one, the Pareto set,
the uniform baselines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from ..profile import LayerSpec, Profile
from ..search_spaces import Pair, SearchSpace, pair_label, pareto_front

__all__ = ["Baseline", "Measured", "best_measured", "measured_trials", "pareto_set"]


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
    """Configurations no other one beats on both bytes per token and KL, fewest bytes first;
    of exact ties, the earliest trial."""
    ordered = sorted(measured, key=lambda m: m.number)
    kept = pareto_front([(m.bytes_per_token, m.kl, i) for i, m in enumerate(ordered)])
    return [ordered[i] for i in kept]


@dataclass(frozen=True)
class Baseline:
    """A uniform configuration measured on the same tokens (fits: within the budget)."""

    label: str
    nominal_bits: float
    effective_bits: float
    bytes_per_token: float
    kl: float
    fits: bool


def uniform_baselines(
    study: optuna.Study,
    space: SearchSpace,
    measured: list[Measured],
    evaluate: Callable[[tuple[LayerSpec, ...]], float],
    extra: bool,
) -> tuple[Baseline, ...]:
    """Uniform configs over the space's widths: the fitting ones come from the study; with
    ``extra`` the others are measured once and cached in the study's user attributes (a rerun
    does not measure them again)."""
    known = {m.choice[0]: m.kl for m in measured if len(set(m.choice)) == 1}
    widths = [b for b in space.widths if b < 16]
    out = []
    for pair in ((k, v) for k in widths for v in widths):
        key = f"baseline {pair[0]}-{pair[1]}"
        kl = known.get(pair, study.user_attrs.get(key))
        if kl is None and not extra:
            continue
        choice = space.uniform(pair)
        if kl is None:
            kl = float(evaluate(space.layer_specs(choice)))
            study.set_user_attr(key, kl)
        m, label = Measured.of(space, choice, kl), pair_label(pair)
        bits = (m.nominal_bits, m.effective_bits)
        out.append(Baseline(label, *bits, m.bytes_per_token, kl, space.fits(choice)))
    return tuple(out)
