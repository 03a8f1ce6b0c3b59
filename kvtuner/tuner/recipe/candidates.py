"""Which per-layer recipes the study measures, and how the local search moves.

A recipe is a format name per layer. Two one-layer tables rank moves:

- ``isolated`` (ModelOpt's score): KL with only layer l in format f, every other layer in the
  model dtype. Summed over layers and minimised under the budget by an exact knapsack, it is
  ModelOpt's layer-wise AutoQuantize pick (:func:`knapsack_pick`).
- ``in_context``: the KL change when layer l moves from the cheapest format to f while every
  other layer stays in the cheapest format: a layer's damage measured among quantized layers,
  which is where the recipe will serve. Errors compound through later layers, so the two tables
  can rank layers differently; both picks are measured whole.

From the best whole recipe measured, :func:`neighbours` proposes single-layer moves and one-up,
one-down swaps that fit the budget, ranked by the ``in_context`` table's predicted change.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from ..knapsack import solve_knapsack

__all__ = ["Recipe", "knapsack_pick", "neighbours", "recipe_bits"]

Recipe = tuple[str, ...]
Table = Sequence[dict[str, float]]  # [layer] -> format -> loss


def recipe_bits(recipe: Recipe, bits: dict[str, Fraction]) -> Fraction:
    return sum((bits[f] for f in recipe), Fraction(0))


def knapsack_pick(
    table: Table, formats: Sequence[str], bits: dict[str, Fraction], capacity: Fraction
) -> Recipe | None:
    """The least summed ``table`` loss over ``formats`` per layer with bits <= ``capacity``."""
    costs = [[bits[f] for f in formats] for _ in table]
    losses = [[row[f] for f in formats] for row in table]
    picks = solve_knapsack(costs, losses, capacity)
    return None if picks is None else tuple(formats[o] for o in picks)


def _moves(recipe: Recipe, formats: Sequence[str]) -> list[tuple[int, str]]:
    return [(layer, f) for layer, now in enumerate(recipe) for f in formats if f != now]


def neighbours(
    recipe: Recipe,
    formats: Sequence[str],
    bits: dict[str, Fraction],
    capacity: Fraction,
    predicted: Table,
    pair_width: int = 8,
) -> list[Recipe]:
    """Recipes one or two layer moves away that fit ``capacity``, best predicted first: every
    single move, and each of the ``pair_width`` best-predicted moves up paired with each of the
    ``pair_width`` cheapest-predicted moves down (the bits one frees pay for the other)."""
    gain = lambda m: predicted[m[0]][m[1]] - predicted[m[0]][recipe[m[0]]]  # noqa: E731
    cost = lambda m: bits[m[1]] - bits[recipe[m[0]]]  # noqa: E731
    moves = _moves(recipe, formats)
    ups = sorted((m for m in moves if cost(m) > 0), key=lambda m: (gain(m) / cost(m), m))
    downs = sorted((m for m in moves if cost(m) < 0), key=lambda m: (gain(m) / -cost(m), m))
    pairs = [(u, d) for u in ups[:pair_width] for d in downs[:pair_width] if u[0] != d[0]]
    options = [((m,), gain(m)) for m in moves] + [((u, d), gain(u) + gain(d)) for u, d in pairs]
    out: dict[Recipe, float] = {}
    for changes, predicted_change in sorted(options, key=lambda o: (o[1], o[0])):
        new = list(recipe)
        for layer, f in changes:
            new[layer] = f
        if recipe_bits(tuple(new), bits) <= capacity:
            out.setdefault(tuple(new), predicted_change)
    return list(out)
