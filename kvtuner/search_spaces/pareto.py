"""The one Pareto filter: keep only items no other item beats on both cost and loss.

Used by the search space (pruning candidate pairs), the search results (the measured front) and
the evaluation plot (the labelled front). O(n log n): one sort, one scan.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from fractions import Fraction

__all__ = ["pareto_front"]


def pareto_front(
    items: Sequence[tuple[Fraction | float, float, Hashable]], *, keep_ties: bool = False
) -> list[Hashable]:
    """Keys of the non-dominated ``(cost, loss, key)`` items, cheapest first.

    Sorted by cost (then loss, then the order listed), an item survives only if its loss is
    strictly below every cheaper survivor's. Of exact ties (same cost and loss) the first one
    listed is kept, or with ``keep_ties`` all of them, in the order listed. An item whose loss
    is NaN is never kept (and does not disturb the sort).
    """
    finite = [i for i, item in enumerate(items) if item[1] == item[1]]  # NaN != NaN
    order = sorted(finite, key=lambda i: (items[i][0], items[i][1], i))
    kept: list[Hashable] = []
    best, last = float("inf"), None
    for i in order:
        cost, loss, key = items[i]
        if loss < best or (keep_ties and (cost, loss) == last):
            kept.append(key)
            best, last = loss, (cost, loss)
    return kept
