"""The knapsack is the exact optimum of the additive model: checked against brute force."""

import itertools
import random
from fractions import Fraction

import pytest

from kvtuner.tuner import solve_knapsack


def brute_force(costs, losses, capacity):
    best, arg = float("inf"), None
    for pick in itertools.product(*(range(len(r)) for r in costs)):
        cost = sum(costs[g][o] for g, o in enumerate(pick))
        loss = sum(losses[g][o] for g, o in enumerate(pick))
        if cost <= capacity and loss < best:
            best, arg = loss, pick
    return best, arg


def total(rows, pick):
    return sum(rows[g][o] for g, o in enumerate(pick))


@pytest.mark.parametrize("seed", range(60))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    groups, options = rng.randint(1, 5), rng.randint(1, 5)
    denom = rng.choice([1, 2, 3, 32])  # fractional costs, like channel blocks per token
    costs = [[Fraction(rng.randint(0, 40), denom) for _ in range(options)] for _ in range(groups)]
    losses = [[rng.random() for _ in range(options)] for _ in range(groups)]
    capacity = Fraction(rng.randint(0, 40 * groups), rng.choice([1, denom, 7]))
    best, arg = brute_force(costs, losses, capacity)
    pick = solve_knapsack(costs, losses, capacity)
    if arg is None:
        assert pick is None
        return
    assert total(costs, pick) <= capacity
    assert total(losses, pick) == pytest.approx(best, abs=1e-12)


def test_infeasible_and_loose():
    costs, losses = [[4, 8], [4, 8]], [[1.0, 0.0], [1.0, 0.0]]
    assert solve_knapsack(costs, losses, Fraction(7)) is None
    assert solve_knapsack(costs, losses, Fraction(8)) == [0, 0]
    assert solve_knapsack(costs, losses, Fraction(12)) in ([0, 1], [1, 0])
    assert solve_knapsack(costs, losses, Fraction(100)) == [1, 1]
