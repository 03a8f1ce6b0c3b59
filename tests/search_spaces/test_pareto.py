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


def front_by_definition(items):
    """Keys no other item beats (fewer-or-equal cost and lower loss, or fewer cost and
    equal-or-lower loss), cheapest first, ties in the order listed: quadratic, but plain."""
    front = [
        (c, key)
        for c, loss, key in items
        if not any((c2 <= c and l2 < loss) or (c2 < c and l2 <= loss) for c2, l2, _ in items)
    ]
    return [key for _, key in sorted(front, key=lambda f: f[0])]


@pytest.mark.parametrize("seed", range(40))
def test_keep_ties_keeps_every_exact_tie_in_listed_order(seed):
    rng = random.Random(seed)
    items = [
        (rng.randint(1, 5), rng.choice([0.0, 0.5, 1.0, 2.0]), i) for i in range(rng.randint(1, 16))
    ]
    rng.shuffle(items)
    assert pareto_front(items, keep_ties=True) == front_by_definition(items)
    firsts = pareto_front(items)
    assert len(firsts) == len({(c, loss) for c, loss, k in items if k in firsts})
    assert set(firsts) <= set(pareto_front(items, keep_ties=True))


def test_nan_losses_are_dropped_and_do_not_disturb_the_rest():
    items = [(2, 1.0, "a"), (1, float("nan"), "n"), (3, 0.5, "b"), (1, 2.0, "c"), (3, 0.7, "d")]
    assert pareto_front(items) == ["c", "a", "b"]
    assert pareto_front(items, keep_ties=True) == ["c", "a", "b"]
