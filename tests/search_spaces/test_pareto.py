"""Pruning keeps exactly the Pareto-optimal candidates."""

import random
from fractions import Fraction

import pytest

from kvtuner.search_spaces import pareto_front


def dominated(item, items):
    c, loss, _ = item
    return any(c2 <= c and l2 <= loss and (c2 < c or l2 < loss) for c2, l2, _ in items)


@pytest.mark.parametrize("seed", range(40))
def test_keeps_only_pareto_pairs(seed):
    rng = random.Random(seed)
    items = [
        (Fraction(rng.randint(1, 8)), rng.choice([0.0, 0.5, 1.0, rng.random()]), i)
        for i in range(rng.randint(1, 12))
    ]
    kept = pareto_front(items)
    by_key = {key: (c, loss, key) for c, loss, key in items}
    assert all(not dominated(by_key[k], items) for k in kept)
    for item in items:
        if item[2] not in kept:  # dropped: dominated, or an exact tie of a kept item
            assert dominated(item, items) or any(by_key[k][:2] == item[:2] for k in kept)
    costs = [by_key[k][0] for k in kept]
    losses = [by_key[k][1] for k in kept]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == len(losses)
