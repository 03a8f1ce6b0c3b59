"""Exact multiple-choice knapsack: one option per group, minimise summed loss, cost <= capacity.

Costs are exact rationals (bits, or bytes with channel blocks amortised per token); they are
scaled to integers by the common denominator and divided by their common gcd, so the dynamic
programme over integer capacities is exact, not an approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from ..errors import KVTunerError

__all__ = ["solve_knapsack"]

_MAX_CELLS = 50_000_000  # groups x capacity cells of the choice table


def _integerise(costs: Sequence[Sequence[Fraction]], capacity: Fraction):
    flat = [Fraction(c) for row in costs for c in row]
    scale = math.lcm(*(c.denominator for c in flat), Fraction(capacity).denominator)
    ints = [int(c * scale) for c in flat]
    unit = math.gcd(*ints) or 1
    cap = math.floor(Fraction(capacity) * scale / unit)  # floor: never exceed the budget
    it = iter(ints)
    return [[next(it) // unit for _ in row] for row in costs], cap


def solve_knapsack(
    costs: Sequence[Sequence[Fraction]],
    losses: Sequence[Sequence[float]],
    capacity: Fraction,
) -> list[int] | None:
    """Index of the chosen option per group, or None when even the cheapest choice overflows.

    ``costs[g][o]`` >= 0 and ``losses[g][o]`` are option o of group g. ``best[c]`` below is the
    least loss of the groups so far with total cost <= c (so it is non-increasing in c).
    """
    if any(c < 0 for row in costs for c in row):
        raise KVTunerError("knapsack costs must be non-negative")
    icosts, cap = _integerise(costs, capacity)
    if cap < 0 or cap < sum(min(row) for row in icosts):
        return None
    if len(icosts) * (cap + 1) > _MAX_CELLS:
        raise KVTunerError(f"knapsack too large ({len(icosts)} groups x {cap + 1} cost steps)")
    best = np.zeros(cap + 1)  # [cap+1]: no groups yet, loss 0 at any capacity
    choice = np.zeros((len(icosts), cap + 1), dtype=np.int32)  # [groups, cap+1] for backtracking
    for g, (row_cost, row_loss) in enumerate(zip(icosts, losses, strict=True)):
        new = np.full(cap + 1, np.inf)
        for o, (c, loss) in enumerate(zip(row_cost, row_loss, strict=True)):
            if c > cap:
                continue
            cand = np.full(cap + 1, np.inf)
            cand[c:] = best[: cap + 1 - c] + float(loss)
            better = cand < new
            new[better], choice[g, better] = cand[better], o
        best = new
    picks, c = [], cap
    for g in range(len(icosts) - 1, -1, -1):
        o = int(choice[g, c])
        picks.append(o)
        c -= icosts[g][o]
    return picks[::-1]
