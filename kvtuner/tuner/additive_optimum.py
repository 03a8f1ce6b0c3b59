"""The additive model's exact optimum over a search space (optionally with a perturbed table)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..search_spaces import Pair, SearchSpace
from .knapsack import solve_knapsack

__all__ = ["dp_optimum"]


def dp_optimum(
    space: SearchSpace, scale: Fraction = Fraction(1), kl: np.ndarray | None = None
) -> tuple[Pair, ...] | None:
    """Least summed single-layer KL within ``scale`` x the budget (None: nothing fits).

    kl: an alternative [layers, 2, len(bits)] table (e.g. the measured one times noise); by
    default the space's own sensitivity.
    """
    table = space.losses.kl if kl is None else kl

    def loss(g: int, pair: Pair) -> float:
        k, v = space.losses.column(pair[0]), space.losses.column(pair[1])
        return float(sum(table[i, 0, k] + table[i, 1, v] for i in space.groups[g].layers))

    costs = [[space.cost(g, p) for p in grp.options] for g, grp in enumerate(space.groups)]
    losses = [[loss(g, p) for p in grp.options] for g, grp in enumerate(space.groups)]
    picks = solve_knapsack(costs, losses, space.budget.capacity(space.fingerprint) * scale)
    if picks is None:
        return None
    return tuple(g.options[o] for g, o in zip(space.groups, picks, strict=True))
