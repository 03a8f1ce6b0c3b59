"""LocalSearchSampler: an Optuna sampler that proposes only budget-feasible, unmeasured
configurations close to what the additive model and the measurements favour.

Two kinds of proposal, alternating at random:
- perturbed knapsack: the exact additive optimum under the sensitivity table multiplied by
  log-normal noise (single-layer KLs are only a proxy of the in-context damage; the noise explores
  the near-optimal alternatives the proxy cannot rank), noise growing while proposals repeat;
- neighbour: one of the best measured trials with one or two groups moved to an adjacent option,
  then repaired with the additive model (downgrade whatever loses least per unit of cost saved
  until the budget holds, then upgrade whatever gains most per unit of cost while it fits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from ..search_spaces import Pair, SearchSpace, pair_label
from .additive_optimum import dp_optimum

__all__ = ["LocalSearchSampler", "neighbour", "perturbed_optimum", "repair"]


def _step(space: SearchSpace, choice: list[Pair], g: int, delta: int) -> tuple[float, Any] | None:
    """(loss change per unit cost change, new option index) for moving group g one option."""
    options = space.groups[g].options
    j = options.index(choice[g]) + delta
    if not 0 <= j < len(options):
        return None
    d_cost = float(space.cost(g, options[j]) - space.cost(g, choice[g]))
    d_loss = space.loss(g, options[j]) - space.loss(g, choice[g])
    return d_loss / d_cost if d_cost else (-np.inf if d_loss < 0 else np.inf), j


def repair(space: SearchSpace, choice: Sequence[Pair], frozen: set[int] = frozenset()):
    """Make ``choice`` fit (cheapest damage first), then spend any slack (best gain first).

    Groups in ``frozen`` (the ones a mutation just moved) are touched only if nothing else can
    give way. Returns None if even the cheapest option everywhere does not fit.
    """
    choice, cap = list(choice), space.budget.capacity(space.fingerprint)
    while space.total_cost(choice) > cap:
        moves = [(_step(space, choice, g, -1), g) for g in range(len(choice))]
        moves = [(m, g) for m, g in moves if m is not None]
        if not moves:
            return None
        free = [(m, g) for m, g in moves if g not in frozen] or moves
        (_, j), g = min(free, key=lambda mg: mg[0][0])  # least loss added per cost saved
        choice[g] = space.groups[g].options[j]
    while True:
        moves = []
        for g in set(range(len(choice))) - set(frozen):
            step = _step(space, choice, g, +1)
            if step is not None and step[0] < 0:
                trial = choice.copy()
                trial[g] = space.groups[g].options[step[1]]
                if space.total_cost(trial) <= cap:
                    moves.append((step[0], g, trial))
        if not moves:
            return tuple(choice)
        choice = min(moves, key=lambda m: (m[0], m[1]))[2]  # most loss removed per cost added


def neighbour(space: SearchSpace, parent: Sequence[Pair], rng: np.random.Generator):
    """One or two groups moved one option up or down (cost order), then repaired."""
    child = list(parent)
    moved = rng.choice(len(child), size=min(len(child), rng.integers(1, 3)), replace=False)
    for g in moved:
        options = space.groups[g].options
        j = options.index(child[g]) + int(rng.choice((-1, 1)))
        child[g] = options[min(max(j, 0), len(options) - 1)]
    return repair(space, child, frozen={int(g) for g in moved})


def perturbed_optimum(space: SearchSpace, rng: np.random.Generator, sigma: float):
    """Additive optimum at the budget with every table entry times exp(sigma * N(0, 1))."""
    noise = np.exp(sigma * rng.standard_normal(space.losses.kl.shape))  # [L, 2, len(bits)]
    return dp_optimum(space, kl=space.losses.kl * noise)


class LocalSearchSampler(optuna.samplers.BaseSampler):
    """Feasible neighbours of the top-``elite`` completed trials (lower objective is better)."""

    def __init__(self, space: SearchSpace, *, seed: int = 0, elite: int = 3, tries: int = 64):
        self.space, self.seed, self.elite, self.tries = space, seed, elite, tries

    def distributions(self) -> dict[str, BaseDistribution]:
        return {
            self.space.param_name(i): CategoricalDistribution([pair_label(p) for p in g.options])
            for i, g in enumerate(self.space.groups)
        }

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return self.distributions()

    def sample_relative(self, study, trial: FrozenTrial, search_space) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, trial.number])
        trials = study.get_trials(deepcopy=False)
        done = sorted(
            (t for t in trials if t.state == TrialState.COMPLETE and t.params),
            key=lambda t: t.value,
        )
        seen = {tuple(sorted(t.params.items())) for t in trials if t.params}
        if not done:
            return {}  # nothing to improve on yet: independent sampling
        child = None
        for attempt in range(self.tries):
            if rng.random() < 0.5:
                child = perturbed_optimum(self.space, rng, sigma=0.3 * 1.1**attempt)
            else:
                parent = done[min(int(rng.geometric(0.5)) - 1, self.elite - 1, len(done) - 1)]
                child = neighbour(self.space, self.space.from_params(parent.params), rng)
            if child and tuple(sorted(self.space.to_params(child).items())) not in seen:
                break
        return self.space.to_params(child) if child else {}

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        rng = np.random.default_rng([self.seed, trial.number, len(trial.params)])
        choices = param_distribution.choices
        return choices[rng.integers(len(choices))]
