"""Tuner: budget arithmetic, the exact additive-model knapsack, the Optuna study, the search."""

from .budget import Budget, layer_bytes
from .knapsack import solve_knapsack

__all__ = ["Budget", "layer_bytes", "solve_knapsack"]
