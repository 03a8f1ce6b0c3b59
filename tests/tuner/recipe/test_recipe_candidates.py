"""The recipe target's proposals: ModelOpt's knapsack pick and the local search's moves."""

from fractions import Fraction

from kvtuner.tuner.recipe.candidates import knapsack_pick, neighbours, recipe_bits

BITS = {"nvfp4": Fraction(9, 2), "fp8": Fraction(8), "auto": Fraction(16)}


def test_knapsack_pick_is_the_least_summed_loss_within_the_bits():
    table = [{"nvfp4": 5.0, "fp8": 1.0}, {"nvfp4": 2.0, "fp8": 1.5}, {"nvfp4": 4.5, "fp8": 0.0}]
    # 3 layers at 17 bits in all: one layer in fp8 (13.5 + 3.5)
    pick = knapsack_pick(table, ["nvfp4", "fp8"], BITS, Fraction(17))
    assert pick == ("nvfp4", "nvfp4", "fp8")  # saves 4.5; layer 0 would save 4.0
    assert recipe_bits(pick, BITS) <= Fraction(17)
    two = knapsack_pick(table, ["nvfp4", "fp8"], BITS, Fraction(41, 2))
    assert two == ("fp8", "nvfp4", "fp8")
    assert knapsack_pick(table, ["nvfp4", "fp8"], BITS, Fraction(13)) is None


def test_neighbours_fit_the_budget_and_come_best_predicted_first():
    recipe = ("fp8", "nvfp4", "nvfp4", "nvfp4")
    predicted = [{"nvfp4": 0.0, "fp8": -0.1, "auto": -0.2},
                 {"nvfp4": 0.0, "fp8": -0.5, "auto": -0.6},
                 {"nvfp4": 0.0, "fp8": -0.05, "auto": -0.06},
                 {"nvfp4": 0.0, "fp8": -0.2, "auto": -0.3}]  # fmt: skip
    capacity = recipe_bits(recipe, BITS)  # no spare bits: only swaps and moves down fit
    found = neighbours(recipe, ["nvfp4", "fp8", "auto"], BITS, capacity, predicted)
    assert found and all(recipe_bits(r, BITS) <= capacity for r in found)
    assert found[0] == ("nvfp4", "fp8", "nvfp4", "nvfp4")  # fp8 moves to the layer that gains most
    assert ("nvfp4", "nvfp4", "nvfp4", "nvfp4") in found  # a move down fits too
    assert len(set(found)) == len(found)
    roomy = neighbours(recipe, ["nvfp4", "fp8", "auto"], BITS, capacity + 12, predicted)
    assert roomy[0] == ("fp8", "auto", "nvfp4", "nvfp4")  # the biggest predicted gain that fits
