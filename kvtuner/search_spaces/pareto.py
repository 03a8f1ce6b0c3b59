"""Pareto pruning: keep only candidates no other candidate beats on both cost and loss."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from fractions import Fraction

__all__ = ["pareto_front"]


def pareto_front(items: Sequence[tuple[Fraction | float, float, Hashable]]) -> list[Hashable]:
    """Keys of the non-dominated ``(cost, loss, key)`` items, cheapest first.

    Sorted by cost (then loss), an item survives only if its loss is strictly below every
    cheaper survivor's; of exact ties (same cost and loss) the first one listed is kept.
    """
    order = sorted(range(len(items)), key=lambda i: (items[i][0], items[i][1], i))
    kept: list[Hashable] = []
    best = float("inf")
    for i in order:
        _cost, loss, key = items[i]
        if loss < best:
            kept.append(key)
            best = loss
    return kept
